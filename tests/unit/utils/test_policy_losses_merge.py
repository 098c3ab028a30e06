"""``benchmarks.policy_losses.merged``: seeds are added one command at a time; a rerun replaces the
kept run of the same loss, seed, steps and overrides, and each gain is compared with the
reference's at the same seed, steps and overrides."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.policy_losses import merged

EXTRA = ["--async_rl.eta", "1"]


def row(loss: str, seed: int, gain: float, extra: list[str] = EXTRA) -> dict:
    return {"loss": loss, "seed": seed, "gain": gain, "steps": 24, "extra": extra}


def test_new_runs_join_the_kept_ones_and_replace_their_own(tmp_path: Path):
    path = tmp_path / "policy_losses.json"
    path.write_text(json.dumps({"results": [row("dapo", 0, 0.5), row("cispo", 0, 0.4), row("dapo", 1, 0.6)]}))
    out = merged([row("cispo", 0, 0.45), row("cispo", 1, 0.55)], path, "dapo")
    assert [(r["loss"], r["seed"], r["gain"]) for r in out] == [
        ("dapo", 0, 0.5),
        ("dapo", 1, 0.6),
        ("cispo", 0, 0.45),
        ("cispo", 1, 0.55),
    ]
    assert [round(r["gain_vs_reference"], 6) for r in out] == [0.0, 0.0, -0.05, -0.05]


def test_a_run_without_its_reference_has_no_difference(tmp_path: Path):
    path = tmp_path / "missing.json"
    out = merged([row("gspo", 2, 0.7), row("dapo", 2, 0.6, extra=[])], path, "dapo")
    assert [r["gain_vs_reference"] for r in out] == [None, 0.0]  # other overrides: not the reference
