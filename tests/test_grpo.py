"""GRPO end to end, submitted as a Ray job to a head this test starts (own temp dir and ports,
stopped by its process group): SFT warm-up, vLLM rollouts on Serve, rewards from the reward
service, DeepSpeed learner, versioned weight pushes, then a re-submission that resumes; and
GRPO learning, as a held-out accuracy gain over the SFT warm-up."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, run_pipeline

STEP_KEYS = ("reward_mean", "reward_std", "accuracy", "kl", "clip_frac", "entropy", "response_len",
             "generate_s", "reward_s", "train_s", "push_s", "staleness_p50", "staleness_p99", "learner_wait_frac",
             "producer_wait_frac", "dropped_stale", "behav_ratio_mean")


@pytest.fixture(scope="module")
def head():
    from raypost.utils.local_head import LocalHead

    with LocalHead(num_cpus=4) as h:
        yield h
    shutil.rmtree(h.temp_dir, ignore_errors=True)


def submit(head, args: list[str], timeout: float = 1500) -> str:
    """``ray job submit --working-dir <repo> -- <venv python> pipelines/grpo.py ARGS``; returns its output."""
    cmd = [str(Path(sys.executable).with_name("ray")), "job", "submit", "--address", head.dashboard_url,
           "--working-dir", str(ROOT), "--", sys.executable, "pipelines/grpo.py", *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=head.env(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0 and "succeeded" in proc.stdout, f"{proc.stdout[-5000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def serve_apps(head) -> set[str]:
    """Names of the Serve apps on the head's cluster (``serve status``)."""
    cmd = [str(Path(sys.executable).with_name("serve")), "status", "-a", head.dashboard_url]
    proc = subprocess.run(cmd, env=head.env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return set((yaml.safe_load(proc.stdout) or {}).get("applications") or {})


def grpo_rows(run: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("phase") == "grpo"]


@pytest.mark.slow
@pytest.mark.timeout(3000)  # two jobs
def test_grpo_job_submit_and_resubmit(head, tmp_path, untrained_reward_model):
    weights = Path(f"/dev/shm/raypost-test-{tmp_path.name}")
    args = ["--config", "examples/grpo_smoke.yaml", "--run.storage_path", str(tmp_path), "--run.name", "g",
            "--run.wandb_mode", "disabled", "--rollout.weights_dir", str(weights)]
    submit(head, [*args, "--algo.steps", "2"])
    run = tmp_path / "g"
    first = json.loads((run / "report.json").read_text())
    assert first["heldout_n"] == 16 and 0 <= first["heldout_accuracy_before"] <= 1
    assert (run / "reward.png").stat().st_size > 1000
    # The finished job took its rollout and reward apps and its pushed weights with it.
    assert serve_apps(head) == set() and not (weights / "g").exists()

    # Re-submitting with a longer budget resumes after step 2: the warm-up is not redone,
    # steps 3-5 are trained from new prompts and weight versions continue. The resumed run is
    # async (eta 1) and adds a reward model (MiniLM, untrained head) to the verifier rewards.
    out = submit(head, [*args, "--algo.steps", "5", "--async_rl.eta", "1", "--reward.model.path",
                        str(untrained_reward_model),
                        "--reward.model.weight", "0.5"])
    assert "sft step" not in out
    assert serve_apps(head) == set() and not (weights / "g").exists()
    shutil.rmtree(weights, ignore_errors=True)
    grpo = grpo_rows(run)
    assert [r["step"] for r in grpo] == [1, 2, 3, 4, 5] and [r["weight_version"] for r in grpo] == [1, 2, 3, 4, 5]
    for r in grpo:
        for key in STEP_KEYS:
            assert key in r, key
        assert r["dropped_stale"] == 0
    for r in grpo[:2]:
        assert r["staleness_max"] == 0  # synchronous: every sample from the current version
        # The learner's log-probs equal the replicas' behaviour log-probs of the same version, so
        # pi_learner / pi_behaviour stays at 1 (a stale or half-reloaded replica moves it).
        assert abs(r["behav_ratio_mean"] - 1.0) < 0.02, r["behav_ratio_mean"]
    # Async: the producer generated the next batch while the learner trained, never 2 versions behind.
    assert max(r["staleness_max"] for r in grpo[2:]) == 1
    for r in grpo[2:]:  # reward = accuracy + 0.1 format + 0.5 reward model, per sample, so in the mean too
        expected = r["score_accuracy"] + 0.1 * r["score_format"] + 0.5 * r["score_rm"]
        assert abs(r["reward_mean"] - expected) < 1e-4, (r["reward_mean"], expected)
    assert "score_rm" not in grpo[0]
    assert len({r["score_rm"] for r in grpo[2:]}) == 3, "the reward model scored every batch differently"
    trained = [json.loads(x) for x in (run / "trained_samples.jsonl").read_text().splitlines()]
    assert [t["step"] for t in trained] == [1, 2, 3, 4, 5] and all(len(t["ids"]) == 16 for t in trained)
    prompts = [p.split("#")[0] for t in trained for p in t["ids"]]
    assert len(set(prompts)) == 5 * 4, "each step draws new prompts; none is replayed after the resume"


@pytest.mark.slow
@pytest.mark.xdist_group("grpo-learning")  # shares no fixture with the job test: may run beside it
@pytest.mark.timeout(2400)
def test_grpo_raises_heldout_accuracy(ray_cluster, serve_url, tmp_path):
    """GRPO learns, measured as the issue asks: held-out greedy accuracy goes up.

    The embedded task as the default builds it (half the SFT demos are a weak teacher's wrong
    guess, '#### <first number>'), on easier operands (1..5) so a one-epoch warm-up learns the
    worked solutions too. The warmed-up greedy policy mostly guesses; GRPO's accuracy reward has
    to move it to the worked solutions it already knows. Broken advantages, a loss of the wrong
    sign, weights that never reach the replicas or a stale reference all leave the gain at ~0."""
    args = ["--run.storage_path", str(tmp_path), "--run.name", "learn", "--run.wandb_mode", "disabled",
            "--run.checkpoint_every", "1000", "--data.synthetic.max_operand", "5", "--data.synthetic.num_train", "6000",
            "--warmup.train.epochs", "1", "--algo.steps", "30", "--optim.lr", "1e-4",
            "--rollout.weights_dir", f"/dev/shm/raypost-test-{tmp_path.name}",
            # Serve is already up on this worker's cluster (serve_url); a different port would be ignored
            "--reward.port", serve_url.rsplit(":", 1)[1]]
    run_pipeline("grpo.py", args, ray_cluster, timeout=2200)
    shutil.rmtree(f"/dev/shm/raypost-test-{tmp_path.name}", ignore_errors=True)
    report = json.loads((tmp_path / "learn" / "report.json").read_text())
    before, after = report["heldout_accuracy_before"], report["heldout_accuracy_after"]
    assert report["heldout_n"] == 200
    # Measured from this warm-up, 30 steps at lr 1e-4: +0.15, +0.165, +0.21 (run.seed 0, 1, 2, from a
    # warm-up at 0.08), at least +0.10 in three suite runs, and +0.08 in one (0.15 -> 0.23, from a
    # warm-up at 0.15). The default lr 5e-5 is too slow for 30 steps (-0.015 in one run), 1.5e-4 gave
    # +0.07 to +0.155. The bound is 2 standard errors of a paired difference of 200 greedy answers
    # (sqrt(30)/200 = 0.027 when 30 of the 200 answers change): a GRPO that does not learn (zero advantages,
    # a flipped sign, weights that never reach the replicas) gains 0 or loses.
    assert after >= before + 0.05, (before, after)


def test_a_failed_run_removes_its_serve_apps(monkeypatch, tmp_path):
    """pipelines/grpo.py tears its Serve apps and pushed weights down when training raises, and
    the error still reaches the caller (phases replaced by fakes: the order of calls is the logic)."""
    import importlib.util

    from raypost.phases import data as data_phase
    from raypost.phases import grpo as grpo_phase

    calls: list[str] = []

    def fail(*_a, **_k):
        calls.append("train")
        raise RuntimeError("learner died")

    monkeypatch.setattr(data_phase, "start_run", lambda cfg: tmp_path)
    monkeypatch.setattr(data_phase, "prepare", lambda *a: ("base", None))
    monkeypatch.setattr(grpo_phase, "check_placement", lambda cfg: None)
    monkeypatch.setattr(grpo_phase, "warmup", lambda *a: ("warm", 0.0))
    monkeypatch.setattr(grpo_phase, "reset_weights", lambda cfg: None)
    monkeypatch.setattr(grpo_phase, "deploy", lambda *a: calls.append("deploy"))
    monkeypatch.setattr(grpo_phase, "evaluate", lambda *a, **k: calls.append("evaluate") or {"accuracy": 0.0})
    monkeypatch.setattr(grpo_phase, "train", fail)
    monkeypatch.setattr(grpo_phase, "teardown", lambda cfg: calls.append("teardown"))
    spec = importlib.util.spec_from_file_location("grpo_pipeline", ROOT / "pipelines" / "grpo.py")
    pipeline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pipeline)
    with pytest.raises(RuntimeError, match="learner died"):
        pipeline.main([])
    assert calls == ["deploy", "evaluate", "train", "teardown"]
