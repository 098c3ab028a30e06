"""Async vs synchronous GRPO: the same workload, seed and placement at eta = 0, 1, 2 in one run.

Every variant is ``pipelines/grpo.py`` in a child process with its own local Ray cluster,
from the same warmed-up model (the first variant's SFT warm-up), on the same prompts in the
same order, for N steps. Only ``async_rl.eta`` (and, for the last row, the placement) changes.

Placement on this 2-core machine:
  disaggregated  one learner worker with one torch thread, and one vLLM replica bound to
                 core 0 (VLLM_CPU_OMP_THREADS_BIND=0): rollout and learner each have a core.
  colocated      two learner workers and the replica share both cores and take turns (eta 0).

Reported per variant: time to N steps (sum of step times), trained completion tokens/s,
learner wait fraction, producer wait fraction, staleness p50/p99/max, groups dropped for
staleness, mean training reward over the last 5 steps, held-out greedy accuracy at step N.
eta = 0 runs with several seeds to give the seed-to-seed spread the async rows are held to.

    .venv/bin/python -m benchmarks.async_vs_sync [--steps 30] [--sync-seeds 0 1 2] [--async-seeds 0] [--model HF]

Prints a table and writes benchmarks/out/async_vs_sync.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import OUT, ROOT, flags, table

DISAGG = [
    "--placement",
    "disaggregated",
    "--resources.num_workers",
    "1",
    "--resources.cpus_per_worker",
    "1",
    "--resources.torch_threads",
    "1",
    "--optim.micro_batch_size",
    "16",
]
COLOC = ["--placement", "colocated", "--resources.num_workers", "2", "--optim.micro_batch_size", "8"]


def run_variant(name: str, args: argparse.Namespace, extra: list[str], model: str | None, env: dict) -> dict:
    out = OUT / "async_vs_sync"
    shutil.rmtree(out / name, ignore_errors=True)
    start = ["--model", model, "--warmup.enabled", "false"] if model else []
    over = {
        "run.storage_path": out,
        "run.name": name,
        "run.wandb_mode": "disabled",
        "run.checkpoint_every": 1000000,
        "algo.steps": args.steps,
        "algo.prompts_per_step": args.prompts,
        "algo.group_size": args.group_size,
        "algo.max_new_tokens": args.max_new_tokens,
        "data.max_eval_samples": args.eval_n,
    }
    cmd = [sys.executable, "pipelines/grpo.py", *start, *flags(over), *extra]
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{proc.stderr[-6000:]}")
    run = out / name
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("phase") == "grpo"]
    report = json.loads((run / "report.json").read_text())
    total = sum(r["step_s"] for r in steps)
    tokens = sum(r["response_len"] * args.prompts * args.group_size for r in steps)
    warm = run / "warmup_done.json"
    return {
        "name": name,
        "time_to_n_s": total,
        "trained_tok_s": tokens / total,
        "step_s_median": statistics.median(r["step_s"] for r in steps),
        "learner_wait_frac": steps[-1]["learner_wait_frac"],
        "producer_wait_frac": steps[-1]["producer_wait_frac"],
        "staleness_p50": statistics.mean(r["staleness_p50"] for r in steps),
        "staleness_p99": max(r["staleness_p99"] for r in steps),
        "staleness_max": max(r["staleness_max"] for r in steps),
        "dropped_stale": steps[-1]["dropped_stale"],
        "reward_last5": statistics.mean(r["reward_mean"] for r in steps[-5:]),
        "heldout_after": report["heldout_accuracy_after"],
        "heldout_before": report["heldout_accuracy_before"],
        "phase_means": {
            k: statistics.mean(r[k] for r in steps) for k in ("generate_s", "train_s", "push_s", "learner_wait_s")
        },
        "job_wall_s": time.time() - t0,
        "cmd": " ".join(cmd[1:]),
        "warm_model": json.loads(warm.read_text())["model_path"] if warm.is_file() else model,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--eval-n", type=int, default=100)
    ap.add_argument("--sync-seeds", type=int, nargs="*", default=[0, 1, 2])
    ap.add_argument("--async-seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--etas", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--no-coloc", action="store_true", help="skip the colocated eta 0 row")
    ap.add_argument(
        "--merge",
        type=Path,
        default=None,
        help="an earlier run's JSON whose variants join the table (same workload; e.g. to add async seeds)",
    )
    ap.add_argument(
        "--model",
        default=None,
        help="start every variant from this warmed-up HF model (default: the first variant's own SFT warm-up)",
    )
    args = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    disagg_env = {**env, "VLLM_CPU_OMP_THREADS_BIND": "0"}
    results, model = [], args.model and str(Path(args.model).resolve())
    if args.merge:
        results = json.loads(args.merge.read_text())["results"]
    plan = [(f"eta0_disagg_s{s}", 0, s, DISAGG, disagg_env) for s in args.sync_seeds]
    plan += [(f"eta{e}_disagg_s{s}", e, s, DISAGG, disagg_env) for e in args.etas for s in args.async_seeds]
    if not args.no_coloc:
        seed = (args.sync_seeds or [0])[0]
        plan += [(f"eta0_coloc_s{seed}", 0, seed, COLOC, env)]
    for name, eta, seed, placement, penv in plan:
        extra = [*placement, "--async_rl.eta", str(eta), "--run.seed", str(seed), "--rollout.seed", str(seed)]
        r = run_variant(name, args, extra, model, penv)
        model = model or r["warm_model"]
        r.update(eta=eta, seed=seed)
        results.append(r)
        print(f"{name}: {r['time_to_n_s']:.1f} s to {args.steps} steps, reward {r['reward_last5']:.3f}", flush=True)
    summarize(results, args)


def summarize(results: list[dict], args: argparse.Namespace) -> None:
    sync = [r for r in results if r["eta"] == 0 and "disagg" in r["name"]]
    base = statistics.mean(r["time_to_n_s"] for r in sync)
    spread = (min(r["reward_last5"] for r in sync), max(r["reward_last5"] for r in sync))
    acc_spread = (min(r["heldout_after"] for r in sync), max(r["heldout_after"] for r in sync))
    rows = [
        [
            r["name"],
            f"{r['time_to_n_s']:.1f}",
            f"{base / r['time_to_n_s']:.2f}",
            f"{r['trained_tok_s']:.0f}",
            f"{r['learner_wait_frac']:.2f}",
            f"{r['producer_wait_frac']:.2f}",
            f"{r['staleness_p50']:.2f}/{r['staleness_p99']:.0f}/{r['staleness_max']:.0f}",
            r["dropped_stale"],
            f"{r['reward_last5']:.3f}",
            f"{r['heldout_after']:.3f}",
        ]
        for r in results
    ]
    print(
        table(
            f"async vs sync GRPO: {args.steps} steps of {args.prompts} prompts x G={args.group_size}, "
            f"{args.max_new_tokens} new tokens (speedup vs the mean eta=0 disaggregated time)",
            [
                "variant",
                "time to N (s)",
                "speedup",
                "tok/s",
                "learner wait",
                "producer wait",
                "stale p50/p99/max",
                "dropped",
                "reward last5",
                "held-out",
            ],
            rows,
        )
    )
    print(
        f"eta=0 seed spread: reward {spread[0]:.3f}..{spread[1]:.3f}, held-out {acc_spread[0]:.3f}..{acc_spread[1]:.3f}"
    )
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "async_vs_sync.json").write_text(
        json.dumps(
            {
                "args": vars(args),
                "results": results,
                "sync_time_mean_s": base,
                "sync_reward_spread": spread,
                "sync_heldout_spread": acc_spread,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
