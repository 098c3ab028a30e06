"""PPO with a critic end to end on a real Ray cluster: the smoke job's warm-up, vLLM rollouts on
Serve and rewards, with the PPO learner (policy and critic engines on the Ray Train worker). The
critic's warm-up step trains the critic alone; every step logs the critic's metrics; the
checkpoint holds the critic; and the same command with more steps resumes both engines and goes
on from the step it stopped at. (That the restored critic is exact: tests/integration/test_ppo_checkpoint.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_pipeline

CRITIC_KEYS = ("value_loss", "explained_variance", "values_mean", "returns_mean", "vf_clip_frac", "critic_step_s")


def _steps(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("phase") == "ppo"]


@pytest.mark.slow
def test_ppo_trains_a_critic_beside_the_policy_and_resumes_both(ray_cluster, tmp_path):
    args = [
        "--config",
        "examples/grpo_smoke.yaml",
        "--run.name",
        "ppo-smoke",
        "--run.storage_path",
        str(tmp_path),
        "--run.wandb_mode",
        "disabled",
        "--critic.warmup_steps",
        "1",
        "--critic.epochs",
        "2",
        "--critic.optim.lr",
        "1e-3",
        # the smoke model answers nothing right yet: a reward that varies with every sample (the
        # completion's length in characters / 100) gives the critic something to learn
        "--reward.rewards",
        '[{name: length, fn: "tests.reward_fns:length_reward", weight: 0.01}]',
    ]
    run_pipeline("ppo.py", args, ray_cluster, timeout=900)
    run = tmp_path / "ppo-smoke"
    report = json.loads((run / "report.json").read_text())
    assert report["pipeline"] == "ppo" and report["heldout_accuracy_after"] is not None
    steps = _steps(run)
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert all(k in s for s in steps for k in CRITIC_KEYS), steps[0]
    assert "loss" not in steps[0] and all("loss" in s for s in steps[1:])  # step 1: the critic alone
    assert steps[0]["values_mean"] == 0.0 and steps[1]["values_mean"] != 0.0  # a zero head, then a trained one
    assert all(s["returns_mean"] > 0 and s["value_loss"] > 0 for s in steps)
    assert list(run.glob("ppo/checkpoint_*/critic")), "the checkpoint holds no critic"

    proc = run_pipeline("ppo.py", [*args, "--algo.steps", "4"], ray_cluster, timeout=900)
    assert "resumed at step 3" in proc.stdout + proc.stderr
    steps = _steps(run)
    assert [s["step"] for s in steps] == [1, 2, 3, 4]
    assert steps[3]["values_mean"] != 0.0  # the restored critic, not a new zero head
