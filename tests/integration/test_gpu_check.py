"""benchmarks/gpu_check.py, the script a session lent a GPU runs, run here on the CPU: each check
that this machine can run passes (a GRPO step with the reference model, a ZeRO-3 push in
buckets, two real steps of every learner on the engine ``build_learner`` makes, a push to a
vLLM replica on Serve), and the ones it cannot (the MFU on the Qwen2.5-0.5B shape, NCCL between
two GPUs) are skipped with their reasons. So the script is known to work before a GPU session spends time on it.
(The replica check joins the session's Ray cluster here; on a GPU machine it starts its own.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_gpu_check_passes_on_the_cpu(ray_cluster, tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "token")}
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check", "--device", "cpu", "--ray-address", ray_cluster],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    checks = json.loads((tmp_path / "gpu_check.json").read_text())["checks"]
    learner, zero3, replica = checks["learner_on_device"], checks["zero3_push"], checks["replica_push"]
    assert learner["ok"] and learner["devices"] == ["cpu"] and learner["grad_rel_err"] < 1e-4
    assert zero3["ok"] and zero3["same_weights"] and zero3["tensors"] > 10
    assert replica["ok"] and replica["greedy_tokens_equal"] and replica["max_logprob_diff"] < 1e-2
    steps = checks["learner_steps"]
    assert steps["ok"] and set(steps["learners"]) == {
        "sft",
        "offline_kd",
        "grpo",
        "on_policy",
        "reward_model",
        "dpo",
        "ppo",
    }
    for name, learner in steps["learners"].items():
        assert learner["device"] == "cpu" and learner["weights_moved"] > 0, name
    assert checks["learner_mfu"] == {"ok": None, "skipped": "needs a GPU", "seconds": 0.0}
    assert checks["collective_nccl"] == {"ok": None, "skipped": "needs 2 GPUs", "seconds": 0.0}
