"""vLLM CPU engines sharing cores: OpenMP threads that spin while idle (libgomp's default)
against threads that sleep (``OMP_WAIT_POLICY=PASSIVE``, what raypost's CPU rollout replicas and
its test suite set), side by side in one run.

Each engine is its own process (``vllm.LLM`` on the tiny offline model, threads bound to the
same cores, as two replicas, or a replica and a test worker's replica, end up on a 2-core
machine). It generates 3 waves of 64 prompts x 64 tokens after one warm-up wave; the figure
is the waves' wall seconds. "pair" runs two engines at once. Then the other side: a tiny
learner's training steps (torch, 2 threads), where sleeping threads cost a wake-up per op.

  .venv/bin/python -m benchmarks.omp_wait_policy
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import OUT, model_for, table

WAVES, PROMPTS, TOKENS = 3, 64, 64
MARK = "OMP_BENCH "  # vLLM logs to stdout too


def child(model: str) -> dict:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams

    from benchmarks.common import prompts_for

    llm = LLM(model=model, dtype="float32", max_model_len=256, enforce_eager=True, kv_cache_memory_bytes=2**28)
    prompts = [{"prompt_token_ids": p} for p in prompts_for(Path(model), PROMPTS)]
    params = SamplingParams(max_tokens=TOKENS, temperature=1.0, ignore_eos=True)
    llm.generate(prompts[:4], params, use_tqdm=False)
    t0 = time.perf_counter()
    for _ in range(WAVES):
        llm.generate(prompts, params, use_tqdm=False)
    return {"seconds": time.perf_counter() - t0}


def learner_child() -> dict:
    """40 AdamW steps of a 2-layer, 64-wide Qwen2 (the tests' tiny learner) on 4 x 96 tokens."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=512,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            intermediate_size=128,
        )
    )
    opt, x = torch.optim.AdamW(model.parameters(), 1e-3), torch.randint(0, 512, (4, 96))
    for i in range(45):
        if i == 5:
            t0 = time.perf_counter()
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad()
    return {"seconds": time.perf_counter() - t0, "threads": torch.get_num_threads()}


def run_learner(policy: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if policy != "default":
        env["OMP_WAIT_POLICY"] = policy
    out = subprocess.run([sys.executable, __file__, "--learner"], env=env, capture_output=True, text=True, timeout=600)
    line = next(x for x in out.stdout.splitlines() if x.startswith(MARK))
    res = json.loads(line[len(MARK) :])
    return {"policy": policy, "threads": res["threads"], "seconds": round(res["seconds"], 2)}


def run(model: Path, policy: str, engines: int, cores: str) -> dict:
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": cores}
    env.pop("OMP_WAIT_POLICY", None)
    if policy != "default":
        env["OMP_WAIT_POLICY"] = policy
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--child", str(model)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for _ in range(engines)
    ]
    secs = []
    for p in procs:
        out, _ = p.communicate(timeout=900)
        if p.returncode != 0:
            raise RuntimeError(f"engine failed ({p.returncode})")
        line = next(x for x in out.splitlines() if x.startswith(MARK))
        secs.append(json.loads(line[len(MARK) :])["seconds"])
    tokens = WAVES * PROMPTS * TOKENS
    return {
        "policy": policy,
        "engines": engines,
        "seconds": [round(s, 2) for s in secs],
        "tokens_per_s_total": round(sum(tokens / s for s in secs), 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--learner", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child or args.learner:
        print(MARK + json.dumps(child(args.child) if args.child else learner_child()), flush=True)
        return
    cores = sorted(os.sched_getaffinity(0))
    bind = f"{cores[0]}-{cores[-1]}" if len(cores) > 1 else str(cores[0])
    model = model_for("tiny")
    rows = [run(model, policy, n, bind) for n in (1, 2) for policy in ("default", "PASSIVE")]
    by = {(r["policy"], r["engines"]): r["tokens_per_s_total"] for r in rows}
    print(
        table(
            f"vLLM engines bound to cores {bind}: {WAVES} x {PROMPTS} prompts x {TOKENS} tokens each",
            ["OMP_WAIT_POLICY", "engines", "seconds per engine", "tokens/s (all engines)"],
            [[r["policy"], r["engines"], r["seconds"], r["tokens_per_s_total"]] for r in rows],
        )
    )
    ratios = {n: round(by[("PASSIVE", n)] / by[("default", n)], 2) for n in (1, 2)}
    print(f"PASSIVE / default throughput: alone {ratios[1]}x, two engines {ratios[2]}x")
    learner = [run_learner(policy) for policy in ("default", "PASSIVE")]
    print(
        table(
            "tiny learner (the tests' 2-layer Qwen2), 40 AdamW steps on 4 x 96 tokens",
            ["OMP_WAIT_POLICY", "torch threads", "seconds"],
            [[r["policy"], r["threads"], r["seconds"]] for r in learner],
        )
    )
    slower = round(learner[1]["seconds"] / learner[0]["seconds"], 2)
    print(f"PASSIVE / default learner step time: {slower}x")
    OUT.mkdir(exist_ok=True)
    (OUT / "omp_wait_policy.json").write_text(
        json.dumps(
            {
                "cores": bind,
                "waves": WAVES,
                "prompts": PROMPTS,
                "tokens": TOKENS,
                "rows": rows,
                "ratio": ratios,
                "learner": learner,
                "learner_ratio": slower,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
