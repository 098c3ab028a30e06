"""Policy losses side by side on one task: ``examples/grpo_smollm2.yaml`` (SmolLM2-135M-Instruct,
SFT warm-up, then GRPO) with only ``algo.loss`` (and its clip range) changed, same seed, one run
after the other on this machine.

    .venv/bin/python -m benchmarks.policy_losses [--losses dapo gspo cispo] [--seeds 0] [--steps 24]
                                                 [--extra --async_rl.correction none ...]

The first loss is the reference (the example's DAPO). Each run is the ``raypost grpo`` command in
a child process with its own local Ray cluster. Reports the held-out greedy accuracy after the
warm-up and after GRPO, the gain, its difference from the reference's gain at the same seed, the
mean GRPO step time and the wall time; writes benchmarks/out/policy_losses.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import OUT, run_grpo, table

# Each loss at its paper's clip range: GSPO's is per sequence (Zheng et al. 2025: 3e-4 / 4e-4);
# CISPO (MiniMax-M1) has no lower bound on its IS weight.
LOSS_FLAGS = {
    "grpo": [],
    "dapo": ["--algo.eps_high", "0.28"],
    "dr_grpo": ["--algo.std_normalize", "false"],
    "gspo": ["--algo.eps_low", "0.0003", "--algo.eps_high", "0.0004"],
    "cispo": ["--algo.eps_low", "1.0", "--algo.eps_high", "0.28"],
}


def run_one(loss: str, seed: int, steps: int, extra: list[str], root: Path) -> dict[str, Any]:
    args = [*["--algo.loss", loss, *LOSS_FLAGS[loss], "--algo.steps", str(steps), "--run.seed", str(seed)], *extra]
    report, grpo, wall_s = run_grpo("examples/grpo_smollm2.yaml", f"pl-{loss}-s{seed}", root, args)
    return {
        "loss": loss,
        "seed": seed,
        "before": report["heldout_accuracy_before"],
        "after": report["heldout_accuracy_after"],
        "gain": report["heldout_gain"],
        "step_s": statistics.mean(r["step_s"] for r in grpo),
        "clip_frac": statistics.mean(r.get("clip_frac", 0.0) for r in grpo),
        "wall_s": wall_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--losses", nargs="+", default=["dapo", "gspo", "cispo"], choices=sorted(LOSS_FLAGS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more overrides for every run")
    args = ap.parse_args()

    results = []
    with tempfile.TemporaryDirectory(prefix="raypost-losses-") as tmp:
        for seed in args.seeds:
            for loss in args.losses:
                results.append(run_one(loss, seed, args.steps, args.extra, Path(tmp)))
                print(json.dumps(results[-1]), flush=True)
    ref = {r["seed"]: r["gain"] for r in results if r["loss"] == args.losses[0]}
    for r in results:
        r["gain_vs_reference"] = r["gain"] - ref[r["seed"]]
    rows = [
        [r["loss"], r["seed"], f"{r['before']:.3f}", f"{r['after']:.3f}", f"{r['gain']:+.3f}"]
        + [f"{r['gain_vs_reference']:+.3f}", f"{r['step_s']:.1f}", f"{r['clip_frac']:.3f}", f"{r['wall_s'] / 60:.1f}"]
        for r in results
    ]
    header = ["loss", "seed", "before", "after", "gain", "vs " + args.losses[0], "step s", "clip frac", "wall min"]
    print(table(f"\nexamples/grpo_smollm2.yaml, {args.steps} GRPO steps, extra: {args.extra}", header, rows))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "policy_losses.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=2))


if __name__ == "__main__":
    main()
