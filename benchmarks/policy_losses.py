"""Policy losses side by side on one task: ``examples/grpo_smollm2.yaml`` (SmolLM2-135M-Instruct,
SFT warm-up, then GRPO) with only ``algo.loss`` (and its clip range) changed, same seed, one run
after the other on this machine.

    .venv/bin/python -m benchmarks.policy_losses [--losses dapo gspo cispo] [--seeds 0] [--steps 24]
                                                 [--extra --async_rl.correction none ...]

The reference is ``--reference`` (the example's DAPO). Each run is the ``raypost grpo`` command in
a child process with its own local Ray cluster. Reports the held-out greedy accuracy after the
warm-up and after GRPO, the gain, its difference from the reference's gain at the same seed and
overrides, the mean GRPO step time and the wall time. benchmarks/out/policy_losses.json keeps
every run: this command's runs replace those of the same loss, seed, steps and overrides, so seeds can be
added one command at a time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
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
    """One ``raypost grpo`` run with ``loss``; its result row."""
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
        "steps": steps,
        "extra": extra,
        "date": time.strftime("%Y-%m-%d"),
    }


def _key(r: dict[str, Any]) -> tuple[Any, ...]:
    return r["loss"], r["seed"], r.get("steps"), tuple(r.get("extra", []))


def merged(new: list[dict[str, Any]], path: Path, reference: str) -> list[dict[str, Any]]:
    """The results kept in ``path`` with ``new`` in place of any of the same loss, seed, steps and
    overrides; each with its gain against ``reference``'s at the same seed, steps and overrides
    (None where that run is missing)."""
    old = json.loads(path.read_text()).get("results", []) if path.is_file() else []
    fresh = {_key(r) for r in new}
    rows = [r for r in old if _key(r) not in fresh] + new
    ref = {_key(r)[1:]: r["gain"] for r in rows if r["loss"] == reference}
    for r in rows:
        base = ref.get(_key(r)[1:])
        r["gain_vs_reference"] = None if base is None else r["gain"] - base
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--losses", nargs="+", default=["dapo", "gspo", "cispo"], choices=sorted(LOSS_FLAGS))
    ap.add_argument("--reference", default="dapo", choices=sorted(LOSS_FLAGS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more overrides for every run")
    args = ap.parse_args()

    new = []
    with tempfile.TemporaryDirectory(prefix="raypost-losses-") as tmp:
        for seed in args.seeds:
            for loss in args.losses:
                new.append(run_one(loss, seed, args.steps, args.extra, Path(tmp)))
                print(json.dumps(new[-1]), flush=True)
    path = OUT / "policy_losses.json"
    results = merged(new, path, args.reference)
    rows = [
        [r["loss"], r["seed"], f"{r['before']:.3f}", f"{r['after']:.3f}", f"{r['gain']:+.3f}"]
        + ["-" if r["gain_vs_reference"] is None else f"{r['gain_vs_reference']:+.3f}"]
        + [f"{r['step_s']:.1f}", f"{r['clip_frac']:.3f}", f"{r['wall_s'] / 60:.1f}", " ".join(r.get("extra", []))]
        for r in results
    ]
    header = ["loss", "seed", "before", "after", "gain", f"vs {args.reference}", "step s", "clip frac", "wall min"]
    print(table("\nexamples/grpo_smollm2.yaml, every kept run", [*header, "extra"], rows))
    OUT.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"reference": args.reference, "results": results}, indent=2))


if __name__ == "__main__":
    main()
