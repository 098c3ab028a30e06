"""Rollout throughput: raypost's Serve vLLM replicas (1 and 2) vs raw in-process vllm.LLM
vs transformers generate, on the same prompts, n, max_tokens and fp32 model.

Both vLLM variants return the sampled tokens' log-probs (``logprobs=0``,
``processed_logprobs``), which GRPO needs. Each variant runs in its own child process (one
benchmark run, back to back); every
figure is the median of ``--repeats`` timed rounds after one warm-up round. Generated
tokens are counted as returned (EOS can end a sample early).

    .venv/bin/python -m benchmarks.rollout_throughput [--shape tiny|100m] [--prompts 16] [--n 8] [--max-tokens 64]

Prints a table and writes benchmarks/out/rollout_throughput_<shape>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path

from benchmarks.common import OUT, model_for, prompts_for, run_child, table


def timed_rounds(fn, repeats: int) -> list[float]:
    fn()  # warm-up
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        tokens = fn()
        rates.append(tokens / (time.perf_counter() - t0))
    return rates


def child_transformers(model: Path, prompts, n: int, max_tokens: int, repeats: int) -> list[float]:
    import torch

    from raypost.models.hf import load_causal_lm, load_tokenizer

    torch.set_num_threads(os.cpu_count() or 1)
    lm, tok = load_causal_lm(model), load_tokenizer(model)
    t = max(len(p) for p in prompts)
    ids = torch.tensor([[tok.pad_token_id] * (t - len(p)) + p for p in prompts])
    mask = (torch.arange(t)[None] >= torch.tensor([t - len(p) for p in prompts])[:, None]).long()

    def go() -> int:
        with torch.no_grad():
            out = lm.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                temperature=1.0,
                num_return_sequences=n,
                max_new_tokens=max_tokens,
                pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id,
            )
        gen = out[:, t:]
        return int(((gen != tok.pad_token_id).cumprod(dim=1)).sum())

    return timed_rounds(go, repeats)


def child_vllm(model: Path, prompts, n: int, max_tokens: int, repeats: int) -> list[float]:
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{(os.cpu_count() or 1) - 1}")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    # Same engine settings as raypost's replicas: sampled-token logprobs of the processed distribution.
    llm = LLM(
        model=str(model),
        dtype="float32",
        enforce_eager=True,
        max_model_len=512,
        seed=0,
        max_num_seqs=256,
        logprobs_mode="processed_logprobs",
    )
    params = SamplingParams(n=n, temperature=1.0, max_tokens=max_tokens, logprobs=0)
    batch = [TokensPrompt(prompt_token_ids=p) for p in prompts]

    def go() -> int:
        outs = llm.generate(batch, params, use_tqdm=False)
        return sum(len(o.token_ids) for r in outs for o in r.outputs)

    try:
        return timed_rounds(go, repeats)
    finally:
        llm.llm_engine.engine_core.shutdown()


def child_serve(model: Path, prompts, n: int, max_tokens: int, repeats: int, replicas: int) -> list[float]:
    import ray
    from ray import serve

    from raypost.config import build
    from raypost.config.serve import RolloutConfig
    from raypost.serve.rollout_app import build_app
    from raypost.serve.rollout_client import RolloutClient

    ray.init(num_cpus=max(2, replicas), include_dashboard=False, log_to_driver=False)
    cfg = build(RolloutConfig, {"num_replicas": replicas, "cpus_per_replica": 1, "max_model_len": 512})
    serve.run(build_app(str(model), cfg), name="rollout", route_prefix=None)
    client = RolloutClient("rollout")  # no pushes: no weight channel

    def go() -> int:
        groups = asyncio.run(client.agenerate(prompts, n, {"temperature": 1.0, "max_tokens": max_tokens}))
        return sum(len(c["token_ids"]) for g in groups for c in g["completions"])

    try:
        return timed_rounds(go, repeats)
    finally:
        serve.shutdown()
        ray.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=["tiny", "100m"], default="tiny")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--child", choices=["transformers", "vllm", "serve1", "serve2"])
    args = ap.parse_args()
    model = model_for(args.shape)
    prompts = prompts_for(model, args.prompts)
    if args.child:
        fn = {
            "transformers": child_transformers,
            "vllm": child_vllm,
            "serve1": lambda *a: child_serve(*a, replicas=1),
            "serve2": lambda *a: child_serve(*a, replicas=2),
        }
        print(json.dumps(fn[args.child](model, prompts, args.n, args.max_tokens, args.repeats)))
        return
    common = [
        "--shape",
        args.shape,
        "--prompts",
        str(args.prompts),
        "--n",
        str(args.n),
        "--max-tokens",
        str(args.max_tokens),
        "--repeats",
        str(args.repeats),
    ]
    load = os.getloadavg()[0]
    names = {
        "transformers": "transformers generate",
        "vllm": "raw vllm.LLM (in-process)",
        "serve1": "raypost Serve, 1 replica",
        "serve2": "raypost Serve, 2 replicas",
    }
    rates = {k: statistics.median(run_child(Path(__file__), common + ["--child", k])) for k in names}
    raw = rates["vllm"]
    rows = [[names[k], f"{v:.0f}", f"{v / raw:.2f}", f"{v / rates['transformers']:.2f}"] for k, v in rates.items()]
    print(
        table(
            f"\nrollout throughput, model {args.shape}, {args.prompts} prompts x n={args.n}, max_tokens "
            f"{args.max_tokens}, fp32, median of {args.repeats}; load before start {load:.2f}",
            ["variant", "gen tok/s", "vs raw vLLM", "vs transformers"],
            rows,
        )
    )
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"rollout_throughput_{args.shape}.json").write_text(
        json.dumps(
            {"args": vars(args), "tokens_per_s": {names[k]: v for k, v in rates.items()}, "load_before": load}, indent=2
        )
    )


if __name__ == "__main__":
    main()
