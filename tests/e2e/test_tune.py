"""pipelines/tune.py on the test cluster: an ASHA sweep over the SFT learner that stops a bad
trial early, survives its driver being killed (the same command restores it without rerunning
finished trials), and writes a best config that reproduces the trial's metric."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, TINY, run_pipeline

GOOD_LR, BAD_LR, LAST_LR = 3e-3, 1e-6, 2e-3
STEPS, EVERY = 16, 4
# PBT: two reports (steps 4, 8); synchronous PBT has the worse trial exploit at step 4 (a worker
# group restart) and both finish at step 8.
PBT_STEPS = 8


def _space(tmp_path: Path) -> Path:
    space = {
        "pipeline": "sft",
        "metric": "eval_loss",
        "mode": "min",
        "num_samples": 1,
        "max_concurrent_trials": 1,
        # max_t above the 4 reports a trial makes: only ASHA's rungs (1, 2, 4) stop a trial.
        "scheduler": {"type": "asha", "max_t": 5, "grace_period": 1, "reduction_factor": 2},
        "search": {"type": "grid"},
        "base": {
            "model": {"tiny": TINY},
            "data": {"synthetic": {"num_train": 400, "num_eval": 40}},
            "resources": {"num_workers": 1, "cpus_per_worker": 0.5},
            "train": {"max_steps": STEPS, "eval_every": EVERY},
            "run": {"checkpoint_every": EVERY, "keep_checkpoints": 1, "wandb_mode": "disabled", "log_every": 4},
        },
        # grid order is trial order: the good lr finishes first, the bad one falls behind it at
        # rung 1, and the driver is killed while the last one runs
        "params": {"optim.lr": {"grid": [GOOD_LR, BAD_LR, LAST_LR]}},
    }
    path = tmp_path / "sft_asha.yaml"
    path.write_text(yaml.safe_dump(space))
    return path


def _finished_trials(sweep: Path) -> list[Path]:
    return sorted({p.parents[2] for p in sweep.glob("trials/*/checkpoint_*/hf/model.safetensors")})


def _third_trial_started(sweep: Path) -> bool:
    """Two trials ended, the third began, and Tune saved its state since then."""
    configs = list(sweep.glob("trials/*/config.yaml"))
    states = list(sweep.glob("experiment_state-*.json"))
    return (
        len(configs) == 3
        and bool(states)
        and max(p.stat().st_mtime for p in states) > max(p.stat().st_mtime for p in configs)
    )


def _kill_when_third_trial_starts(cmd: list[str], env: dict, sweep: Path, timeout: float) -> None:
    """Run the sweep driver; SIGKILL it (the process group we started) once the third trial began."""
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.time() + timeout
    try:
        while time.time() < deadline and proc.poll() is None and not _third_trial_started(sweep):
            time.sleep(0.5)
        assert proc.poll() is None, "the sweep ended before it could be interrupted"
        assert _third_trial_started(sweep), "the third trial did not start in time"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _trained_steps(trial: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (trial / "trained_samples.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.xdist_group("tune-asha")  # the two sweeps share no fixture: they may run on both workers
@pytest.mark.timeout(2700)
def test_asha_sweep_restores_after_driver_kill_and_best_config_reproduces(ray_cluster, tmp_path):
    space = _space(tmp_path)
    cmd = [
        sys.executable,
        str(ROOT / "pipelines" / "tune.py"),
        "--pipeline",
        "sft",
        "--space",
        str(space),
        "--storage",
        str(tmp_path),
        "--name",
        "sweep",
    ]
    env = {**os.environ, "RAY_ADDRESS": ray_cluster, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "token")}
    sweep = tmp_path / "sweep"

    _kill_when_third_trial_starts(cmd, env, sweep, timeout=1500)
    before = {p.parent.name: _trained_steps(p.parent) for p in sweep.glob("trials/*/trained_samples.jsonl")}

    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads((sweep / "results.json").read_text())
    by_lr = {t["config"]["optim.lr"]: t for t in results["trials"]}
    assert sorted(by_lr) == sorted([GOOD_LR, BAD_LR, LAST_LR])
    good, bad, last = by_lr[GOOD_LR], by_lr[BAD_LR], by_lr[LAST_LR]
    assert (good["state"], good["iterations"]) == ("completed", STEPS // EVERY)
    # ASHA stopped the bad trial at its first rung (4 steps), behind the good one
    assert (bad["state"], bad["iterations"]) == ("stopped early", 1), bad
    assert bad[results["metric"]] > good[results["metric"]]
    assert "| stopped early |" in proc.stdout
    # the restored sweep did not rerun the two ended trials; the interrupted one finished
    assert before[good["trial"]] == _trained_steps(sweep / "trials" / good["trial"]) == list(range(1, STEPS + 1))
    bad_steps = _trained_steps(sweep / "trials" / bad["trial"])
    assert before[bad["trial"]] == bad_steps and bad_steps[:EVERY] == list(range(1, EVERY + 1))
    assert len(bad_steps) < STEPS  # stopped: it never reached its last step
    assert last["state"] in ("completed", "stopped early") and last["iterations"] >= 1

    # best config and model: the finished trial with the lowest eval loss
    best = min((t for t in (good, last) if t["state"] == "completed"), key=lambda t: t["eval_loss"])
    assert (results["best_trial"], results["best_metric"]) == (best["trial"], best["eval_loss"])
    best_ckpt = Path(best["checkpoint_path"])
    assert (sweep / "best_model" / "model.safetensors").read_bytes() == (
        best_ckpt / "hf" / "model.safetensors"
    ).read_bytes()
    assert (sweep / "metric.png").stat().st_size > 5000
    run_pipeline("sft.py", ["--config", str(sweep / "best_config.yaml")], ray_cluster)
    report = json.loads((tmp_path / "sweep-best" / "report.json").read_text())
    assert report["final_metrics"]["eval_loss"] == pytest.approx(results["best_metric"], rel=0.02)


def _pbt_space(tmp_path: Path) -> Path:
    space = {
        "pipeline": "sft",
        "metric": "eval_loss",
        "mode": "min",
        "num_samples": 1,
        "max_concurrent_trials": 2,
        # two trials: after each report the worse one (bottom half) restarts from the better one's checkpoint,
        # with the better one's lr times 0.8 or 1.2 (no resampling)
        # synch: the two trials compare at equal steps however their start-ups overlap on a loaded machine
        # (asynchronous PBT once let the bad trial reach step 8 before the good one had reported at all)
        "scheduler": {
            "type": "pbt",
            "perturbation_interval": 1,
            "quantile_fraction": 0.5,
            "resample_probability": 0.0,
            "synch": True,
        },
        "search": {"type": "grid"},
        "base": {
            "model": {"tiny": TINY},
            "data": {"synthetic": {"num_train": 400, "num_eval": 40}},
            "resources": {"num_workers": 1, "cpus_per_worker": 0.5, "torch_threads": 1},
            "optim": {"scheduler": "constant", "warmup_ratio": 0.0},
            "train": {"max_steps": PBT_STEPS, "eval_every": EVERY},
            "run": {"checkpoint_every": EVERY, "keep_checkpoints": 1, "wandb_mode": "disabled", "log_every": 4},
        },
        "params": {"optim.lr": {"grid": [GOOD_LR, BAD_LR]}},
    }
    path = tmp_path / "sft_pbt.yaml"
    path.write_text(yaml.safe_dump(space))
    return path


@pytest.mark.slow
@pytest.mark.xdist_group("tune-pbt")
@pytest.mark.timeout(2400)
def test_pbt_exploit_restarts_from_the_better_trial_with_a_perturbed_lr(ray_cluster, tmp_path):
    cmd = [
        sys.executable,
        str(ROOT / "pipelines" / "tune.py"),
        "--pipeline",
        "sft",
        "--space",
        str(_pbt_space(tmp_path)),
        "--storage",
        str(tmp_path),
        "--name",
        "pbt",
    ]
    env = {**os.environ, "RAY_ADDRESS": ray_cluster, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "token")}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=2200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    sweep = tmp_path / "pbt"
    lineage = {
        p.parent.name: [json.loads(x) for x in p.read_text().splitlines()]
        for p in sweep.glob("trials/*/pbt_segments.jsonl")
    }
    assert len(lineage) == 2
    # The bad-lr trial restarted from a checkpoint of the other trial, mid-run, with a new lr.
    exploits = [
        (trial, seg)
        for trial, segs in lineage.items()
        for seg in segs
        if seg["start_from"] and f"/trials/{trial}/" not in seg["start_from"]
    ]
    assert exploits, lineage
    # The first exploit copies an unperturbed trial (later ones may copy a trial that exploited before).
    trial, seg = min(exploits, key=lambda e: e[1]["step"])
    assert 0 < seg["step"] < PBT_STEPS and seg["step"] % EVERY == 0
    assert seg["lr"] in (pytest.approx(GOOD_LR * 0.8), pytest.approx(GOOD_LR * 1.2)), seg
    # Its next segment continued the donor's run at the next step, and trained with its own lr
    # (constant schedule: the logged lr is the base lr), not the lr stored in the donor's checkpoint.
    run = sweep / "trials" / trial / seg["segment"]
    assert _trained_steps(run)[0] == seg["step"] + 1
    logged = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(r["lr"] == pytest.approx(seg["lr"]) for r in logged if "lr" in r)
    results = json.loads((sweep / "results.json").read_text())
    assert all(t["state"] == "completed" for t in results["trials"])
    assert (sweep / "best_model" / "model.safetensors").is_file()
