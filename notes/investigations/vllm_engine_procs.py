"""vLLM on CPU, one engine process or two: the multiprocess executor vLLM picks on CPU (an
engine-core process plus a worker process, each importing vLLM) against the uniproc executor
raypost's CPU replicas use (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the worker runs inside the
engine-core process, OpenMP bound through OMP_PLACES), side by side in one run.

Each engine is an ``AsyncLLM`` (what a rollout replica runs) in a fresh process, with spawn as
in a Ray actor, bound to all cores. The figures: seconds from the import of vLLM to a ready
engine, CPU seconds of the whole process tree up to then, and generation tokens/s (2 waves of 32
prompts x 96 tokens after one warm-up wave). Each mode runs ``--repeats`` times, alternating;
the table shows the medians.

  .venv/bin/python -m benchmarks.vllm_engine_procs               # tiny model and SmolLM2 (if installed)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path

from benchmarks.common import OUT, model_for, run_child, table

WAVES, PROMPTS, TOKENS = 2, 32, 96
MARK = "ENGINE_BENCH "  # vLLM logs to stdout too


def _tree_cpu_seconds() -> float:
    """CPU seconds of this process and of every process below it, live or reaped."""
    import psutil

    me = psutil.Process()
    live = [me, *me.children(recursive=True)]
    total = 0.0
    for p in live:
        try:
            t = p.cpu_times()
            total += t.user + t.system + (t.children_user + t.children_system if p is me else 0.0)
        except psutil.NoSuchProcess:
            pass
    return total


async def _engine(model: str) -> dict:
    t0 = time.perf_counter()
    from vllm import AsyncEngineArgs, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.v1.engine.async_llm import AsyncLLM

    from benchmarks.common import prompts_for

    engine = AsyncLLM.from_engine_args(
        AsyncEngineArgs(model=model, dtype="float32", max_model_len=512, enforce_eager=True, seed=0)
    )
    ready, cpu = time.perf_counter() - t0, _tree_cpu_seconds()
    prompts = [TokensPrompt(prompt_token_ids=p) for p in prompts_for(Path(model), PROMPTS)]
    params = SamplingParams(max_tokens=TOKENS, temperature=1.0, ignore_eos=True)

    async def wave(tag: str) -> None:
        async def one(i: int, p: TokensPrompt) -> None:
            async for _ in engine.generate(p, params, request_id=f"{tag}-{i}"):
                pass

        await asyncio.gather(*[one(i, p) for i, p in enumerate(prompts)])

    await wave("warm")
    t1 = time.perf_counter()
    for w in range(WAVES):
        await wave(str(w))
    gen = time.perf_counter() - t1
    engine.shutdown()
    return {"ready_s": ready, "cpu_s_to_ready": cpu, "tokens_per_s": WAVES * PROMPTS * TOKENS / gen}


def child(model: str, mode: str) -> dict:
    """Set the environment as a replica would, then time the engine."""
    os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"  # what vLLM forces inside a Ray actor
    cores = sorted(os.sched_getaffinity(0))
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = f"{cores[0]}-{cores[-1]}" if len(cores) > 1 else str(cores[0])
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if mode == "uniproc":
        from raypost.config.serve import RolloutConfig
        from raypost.serve.engine_env import cpu_engine_env

        cpu_engine_env(RolloutConfig())  # VLLM_ENABLE_V1_MULTIPROCESSING=0 + OMP binding, as a replica
    return asyncio.run(_engine(model))


def run(model: Path, mode: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "VLLM_"))}
    return run_child(Path(__file__), ["--child", str(model), "--mode", mode], base_env=env, timeout=900, mark=MARK)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=["multiproc", "uniproc"], help=argparse.SUPPRESS)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if args.child:
        print(MARK + json.dumps(child(args.child, args.mode)), flush=True)
        return
    from raypost.models import named

    models = {"tiny": model_for("tiny")}
    try:
        models["smollm2-135m-instruct"] = Path(named.resolve("smollm2-135m-instruct"))
    except Exception as e:  # noqa: BLE001 - the package is optional here
        print(f"SmolLM2 skipped: {e}")
    rows, result = [], {"waves": WAVES, "prompts": PROMPTS, "tokens": TOKENS, "repeats": args.repeats, "models": {}}
    for name, path in models.items():
        runs: dict[str, list[dict]] = {"multiproc": [], "uniproc": []}
        for _ in range(args.repeats):
            for mode in runs:
                runs[mode].append(run(path, mode))
        med = {m: {k: round(statistics.median(r[k] for r in rs), 1) for k in rs[0]} for m, rs in runs.items()}
        result["models"][name] = {"runs": runs, "median": med}
        rows += [[name, m, med[m]["ready_s"], med[m]["cpu_s_to_ready"], med[m]["tokens_per_s"]] for m in runs]
    print(
        table(
            f"AsyncLLM on CPU, medians of {args.repeats}: {WAVES} waves of {PROMPTS} prompts x {TOKENS} tokens",
            ["model", "executor", "s to ready", "CPU s to ready", "tokens/s"],
            rows,
        )
    )
    for name, r in result["models"].items():
        mp, up = r["median"]["multiproc"], r["median"]["uniproc"]
        print(
            f"{name}: uniproc / multiproc: ready {up['ready_s'] / mp['ready_s']:.2f}x, "
            f"CPU {up['cpu_s_to_ready'] / mp['cpu_s_to_ready']:.2f}x, "
            f"tokens/s {up['tokens_per_s'] / mp['tokens_per_s']:.2f}x"
        )
    OUT.mkdir(exist_ok=True)
    (OUT / "vllm_engine_procs.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
