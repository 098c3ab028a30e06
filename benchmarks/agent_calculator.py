"""The calculator agent against single-turn GRPO without the tool, on SmolLM2-135M-Instruct.

Both arms run ``examples/grpo_agent_calculator_smollm2.yaml`` (chains of 3-5 operands with 2-3
digits, the same warm-up length, steps, loss and sampling), one after the other on this machine:

- ``tool``: the example as shipped: SFT warm-up on the episode's turns, then multi-turn GRPO with
  the calculator Serve app; held-out accuracy is one greedy episode per row, with the tool.
- ``notool``: ``agent.env`` null and no tool demos: SFT warm-up on the gold worked answers, then
  single-turn GRPO; held-out accuracy is one greedy completion per row.

    .venv/bin/python -m benchmarks.agent_calculator [--arms tool notool] [--seeds 0 1]

Each run is the ``raypost grpo`` command in a child process with its own local Ray cluster. Runs
are merged into benchmarks/out/agent_calculator_smollm2.json by (arm, seed), so arms and seeds can
be run one at a time; the summary holds, per seed, the tool arm's gain over its own start and its
lead over the no-tool arm after the same steps.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import OUT, run_grpo, table

EXAMPLE = "examples/grpo_agent_calculator_smollm2.yaml"
NO_TOOL_PROMPT = "Work out the arithmetic. End with a line '#### <number>'."
ARMS = {
    "tool": [],
    "notool": [
        *["--agent.env", "null", "--data.synthetic.tool_demos", "false"],
        *["--data.system_prompt", NO_TOOL_PROMPT],
    ],
}
OUT_FILE = OUT / "agent_calculator_smollm2.json"


def run_one(arm: str, seed: int, root: Path) -> dict[str, Any]:
    args = [*ARMS[arm], "--run.seed", str(seed)]
    return record(arm, seed, args, *run_grpo(EXAMPLE, f"calc-{arm}-s{seed}", root, args))


def collected(arm: str, seed: int, run_dir: Path) -> dict[str, Any]:
    """A run made by hand with the arm's overrides (``--collect``): its report and metrics."""
    report = json.loads((run_dir / "report.json").read_text())
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    grpo = [r for r in rows if r.get("phase") == "grpo"]
    return record(arm, seed, [*ARMS[arm], "--run.seed", str(seed)], report, grpo, report["wall_s"])


def record(arm: str, seed: int, args: list[str], report: dict, grpo: list[dict], wall_s: float) -> dict[str, Any]:
    keep = ("accuracy", "n", "turns", "tool_calls", "parse_error_end_frac", "finish")
    return {
        "arm": arm,
        "seed": seed,
        "command": " ".join(["raypost grpo --config", EXAMPLE, *args]),
        "before": {k: v for k, v in report["heldout_before"].items() if k in keep},
        "after": {k: v for k, v in report["heldout_after"].items() if k in keep},
        "gain": report["heldout_gain"],
        "reward_by_step": [round(r["reward_mean"], 4) for r in grpo],
        "step_s": statistics.mean(r["step_s"] for r in grpo),
        "warmup_s": report["phase_s"]["warmup"],
        "wall_s": wall_s,
        "learner_rss_gb": [round(r["learner_rss_gb"], 2) for r in grpo if "learner_rss_gb" in r],
        "samples_after": report["samples_after"][:2],
    }


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    by = {(r["arm"], r["seed"]): r for r in runs}
    out = {}
    for (arm, seed), r in sorted(by.items()):
        if arm != "tool":
            continue
        base = by.get(("notool", seed))
        out[f"seed {seed}"] = {
            "tool_before": r["before"]["accuracy"],
            "tool_after": r["after"]["accuracy"],
            "gain_over_start": r["gain"],
            "notool_after": base["after"]["accuracy"] if base else None,
            "lead_over_notool": r["after"]["accuracy"] - base["after"]["accuracy"] if base else None,
            "wall_min": r["wall_s"] / 60,
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    ap.add_argument("--collect", nargs=3, metavar=("ARM", "SEED", "RUN_DIR"), help="record a run made by hand")
    args = ap.parse_args()
    old = json.loads(OUT_FILE.read_text())["runs"] if OUT_FILE.exists() else []
    runs = {(r["arm"], r["seed"]): r for r in old}
    if args.collect:
        arm, seed, run_dir = args.collect
        runs[(arm, int(seed))] = collected(arm, int(seed), Path(run_dir))
        args.seeds = []
    with tempfile.TemporaryDirectory(prefix="agent-calc-") as tmp:
        for seed in args.seeds:
            for arm in args.arms:
                runs[(arm, seed)] = run_one(arm, seed, Path(tmp))
                print(f"{arm} seed {seed}: {runs[(arm, seed)]['before']['accuracy']:.3f} -> "
                      f"{runs[(arm, seed)]['after']['accuracy']:.3f}", flush=True)  # fmt: skip
    done = sorted(runs.values(), key=lambda r: (r["seed"], r["arm"]))
    result = {"example": EXAMPLE, "runs": done, "summary": summary(done)}
    OUT.mkdir(parents=True, exist_ok=True)
    OUT_FILE.write_text(json.dumps(result, indent=2))
    rows = [
        [r["arm"], r["seed"], f"{r['before']['accuracy']:.3f}", f"{r['after']['accuracy']:.3f}",
         f"{r['gain']:+.3f}", f"{r['step_s']:.1f}", f"{r['wall_s'] / 60:.1f}"]
        for r in done
    ]  # fmt: skip
    print(table("\ncalculator agent vs no tool, SmolLM2-135M-Instruct",
                ["arm", "seed", "before", "after", "gain", "step s", "wall min"], rows))  # fmt: skip


if __name__ == "__main__":
    main()
