"""The pass-rate pass before GRPO on real parts: the smoke job's tiny model on a vLLM replica,
a reward app scoring each sample pass/fail (a hash of its text), a Ray Data pass of k samples
per prompt. What it records is checked against what it must be: each pass rate is the share
of its recorded rewards at the threshold; the learner's prompt order holds exactly the prompts
inside the band, easy first; GRPO trains only those; a resumed run reuses the pass."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_pipeline

SAMPLES, SCORED = 4, 24


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_grpo_trains_the_prompts_inside_the_pass_rate_band_easy_first_and_resumes(ray_cluster, tmp_path):
    args = [
        "--config",
        "examples/grpo_smoke.yaml",
        "--run.name",
        "passrate",
        "--run.storage_path",
        str(tmp_path),
        "--run.wandb_mode",
        "disabled",
        "--warmup.enabled",
        "false",
        "--algo.steps",
        "2",
        "--reward.rewards",
        '[{name: coin, fn: "tests.reward_fns:coin", weight: 1.0}]',
        "--pass_rate.enabled",
        "true",
        "--pass_rate.samples",
        str(SAMPLES),
        "--pass_rate.max_prompts",
        str(SCORED),
        "--pass_rate.order",
        "easy_first",
    ]
    run_pipeline("grpo.py", args, ray_cluster, timeout=900)
    run = tmp_path / "passrate"
    rates = _jsonl(run / "pass_rates.jsonl")
    assert len(rates) == SCORED and len({r["id"] for r in rates}) == SCORED
    for r in rates:  # the rate is what its recorded rewards say, at the default threshold 1.0
        assert len(r["rewards"]) == SAMPLES and set(r["rewards"]) <= {0.0, 1.0}
        assert r["pass_rate"] == sum(x >= 1.0 for x in r["rewards"]) / SAMPLES
    kept = {r["id"]: r["pass_rate"] for r in rates if 0.0 < r["pass_rate"] < 1.0}
    assert kept, rates

    order = json.loads((run / "prompt_order.json").read_text())
    assert set(order) == set(kept)  # every kept prompt, no other
    first_epoch = [kept[i] for i in order[: len(kept)]]
    assert first_epoch == sorted(first_epoch, reverse=True)  # easy first
    trained = {i.split("#")[0] for row in _jsonl(run / "trained_samples.jsonl") for i in row["ids"]}
    assert trained and trained <= set(kept)
    summary = json.loads((run / "pass_rate_summary.json").read_text())
    assert summary["scored"] == SCORED and summary["kept"] == len(kept)

    before = (run / "pass_rates.jsonl").read_text()
    proc = run_pipeline("grpo.py", [*args, "--algo.steps", "3"], ray_cluster, timeout=900)
    logs = proc.stdout + proc.stderr
    assert "pass rates: reusing" in logs and "resumed at step 2" in logs
    assert (run / "pass_rates.jsonl").read_text() == before
    assert json.loads((run / "prompt_order.json").read_text())[: len(order)] == order
