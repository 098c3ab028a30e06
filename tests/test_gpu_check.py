"""benchmarks/gpu_check.py, the script a session lent a GPU runs, run here on the CPU: each check
that this machine can run passes (a GRPO step with the reference model, a ZeRO-3 push in
buckets, a push to a vLLM replica on Serve), and the one it cannot (NCCL between two GPUs) is
skipped with its reason. So the script is known to work before a GPU session spends time on it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_gpu_check_passes_on_the_cpu(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path)}
    env.pop("RAY_ADDRESS", None)  # the script starts its own Ray for the replica check
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--device", "cpu"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=840)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    checks = json.loads((tmp_path / "gpu_check.json").read_text())["checks"]
    learner, zero3, replica = checks["learner_on_device"], checks["zero3_push"], checks["replica_push"]
    assert learner["ok"] and learner["devices"] == ["cpu"] and learner["grad_rel_err"] < 1e-4
    assert zero3["ok"] and zero3["same_weights"] and zero3["tensors"] > 10
    assert replica["ok"] and replica["greedy_tokens_equal"] and replica["max_logprob_diff"] < 1e-2
    assert checks["collective_nccl"] == {"ok": None, "skipped": "needs 2 GPUs", "seconds": 0.0}
