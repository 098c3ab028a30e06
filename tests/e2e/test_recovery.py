"""Recovery: the reward endpoint through a GCS outage (Redis-backed GCS fault tolerance on a
head this test starts), the re-submit wrapper, log rewinding on restore, and the rollout
scaling policy with its operator pin. The GRPO fault drills (replica, worker, head restart,
1-2-1 scaling) run in benchmarks/chaos.py; their figures are in benchmarks/RESULTS.md."""

from __future__ import annotations

import json
import os
import shlex
import sys
from types import SimpleNamespace

import pytest

from benchmarks.chaos import gcs_drill
from raypost.train.checkpointing import log_trained, rewind_logs


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_reward_endpoint_answers_while_the_gcs_is_down():
    out = gcs_drill(outage_s=10.0)
    assert out["sent_during_outage"] > 50
    assert out["answered_during_outage"] == out["sent_during_outage"]
    assert out["sent_after"] > 20 and out["answered_after"] == out["sent_after"]
    assert out["cluster_schedules_after"], "the restarted GCS did not take new work"


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_resubmit_wrapper_runs_the_same_command_until_it_succeeds(tmp_path):
    from raypost.utils.local_head import LocalHead
    from raypost.utils.resubmit import submit_until_done

    marker = tmp_path / "attempts"
    # Fails on the first run, succeeds on the second: what a pipeline does when the first
    # attempt dies and the second resumes from its checkpoint.
    script = (
        f"import pathlib,sys; p=pathlib.Path({str(marker)!r}); n=len(p.read_text()) if p.exists() else 0; "
        "p.write_text('x'*(n+1)); sys.exit(1 if n == 0 else 0)"
    )
    with LocalHead(num_cpus=1) as head:  # the wrapper sends Ray's token itself (no env changes here)
        out = submit_until_done(
            head.dashboard_url, shlex.join([sys.executable, "-c", script]), max_attempts=3, poll_s=0.5, wait_head_s=60
        )
    assert out.status == "SUCCEEDED"
    assert [a["status"] for a in out.attempts] == ["FAILED", "SUCCEEDED"]
    assert marker.read_text() == "xx"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_resubmit_wrapper_submits_again_after_a_head_crash_though_the_dead_job_reads_running(tmp_path):
    """The head dies with the job's driver; restarted on the same Redis, its job server reads the
    job RUNNING for good (Ray 2.60). The wrapper sees that the driver's node is dead and submits
    again: the second run finishes. (It waited forever before: the `resubmit` drill hung.)"""
    import threading
    import time

    from raypost.utils.local_head import LocalHead
    from raypost.utils.local_redis import LocalRedis
    from raypost.utils.resubmit import submit_until_done

    runs = tmp_path / "runs"
    runs.mkdir()
    # The first run says it started, then waits; the second finishes at once.
    script = (
        f"import os,pathlib,time; d=pathlib.Path({str(runs)!r}); n=len(list(d.iterdir())); "
        "(d/str(n)).write_text(str(os.getpid())); n == 0 and time.sleep(300)"
    )
    box: dict = {}
    with LocalRedis() as redis:
        head = LocalHead(num_cpus=1, redis_address=redis.address, block=False).start()
        wrapper = threading.Thread(
            target=lambda: box.update(
                out=submit_until_done(
                    head.dashboard_url, shlex.join([sys.executable, "-c", script]), max_attempts=3, poll_s=0.5
                )
            ),
            daemon=True,
        )
        try:
            wrapper.start()
            deadline = time.time() + 180
            while not (runs / "0").exists() and time.time() < deadline:
                time.sleep(0.2)
            assert (runs / "0").exists(), "the first run did not start"
            head.crash()
            head.start()
            wrapper.join(300)
            assert not wrapper.is_alive(), "the wrapper still waits on the job that died with the head"
        finally:
            head.stop()
            _stop_if_alive(runs / "0")  # the first run's driver, should it have outlived its head
    out = box["out"]
    assert out.status == "SUCCEEDED"
    assert [a["status"] for a in out.attempts] == ["LOST", "SUCCEEDED"]
    assert sorted(p.name for p in runs.iterdir()) == ["0", "1"]


def _stop_if_alive(pid_file) -> None:
    import signal

    import psutil

    if not pid_file.exists():
        return
    pid = int(pid_file.read_text())
    if psutil.pid_exists(pid) and "python" in psutil.Process(pid).name():
        os.kill(pid, signal.SIGKILL)


def test_data_phase_actors_are_never_restartable(ray_cluster, tiny_model, tmp_path):
    """The data phase leaves no actor a restarted GCS could trip on. Ray Data's actor pools
    default to max_restarts=-1: a GRPO job once left its tokenizer pool DEAD, out of scope and
    restartable, and the GCS reloading it from Redis after a head crash aborted (docs/recovery.md;
    the `resubmit` drill). Tokenizing now runs as Ray Data tasks (``preprocess.map_light``): no
    actor at all; the actor pools left (the teacher pass) get max_restarts=0."""
    import ray

    from raypost.config import DataConfig, ModelConfig
    from raypost.phases.data import prepare
    from raypost.utils.cluster import actor_table, restartable_dead_actors

    job = ray.get_runtime_context().get_job_id()
    _, data = prepare(
        DataConfig(synthetic={"num_train": 40, "num_eval": 8}), ModelConfig(path=str(tiny_model)), tmp_path
    )
    assert data.counts["train"]["kept"] == 40  # the datasets stay referenced from here on
    assert [a["class_name"] for a in actor_table(job) if "MapWorker" in a["class_name"]] == []
    assert restartable_dead_actors(job) == []


def test_rewind_drops_what_the_restored_model_never_kept(tmp_path):
    for step in range(1, 6):
        log_trained(tmp_path, step, [f"s{step}a", f"s{step}b"])
    rows = [{"step": s, "phase": "grpo", "loss": 0.1 * s} for s in range(1, 6)] + [{"step": 9, "phase": "sft"}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert rewind_logs(tmp_path, 3, "grpo") == 4  # steps 4, 5 in both logs
    trained = [json.loads(x) for x in (tmp_path / "trained_samples.jsonl").read_text().splitlines()]
    assert [r["step"] for r in trained] == [1, 2, 3] and trained[2]["ids"] == ["s3a", "s3b"]
    kept = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["phase"]) for r in kept] == [(1, "grpo"), (2, "grpo"), (3, "grpo"), (9, "sft")]
    assert rewind_logs(tmp_path, 3, "grpo") == 0
    # A worker group restarted before any checkpoint registered starts over at step 0: what the
    # lost attempt logged goes (the worker drill once kept steps 1-4 twice).
    assert rewind_logs(tmp_path, 0, "grpo") == 6  # steps 1-3 in both logs
    assert (tmp_path / "trained_samples.jsonl").read_text() == ""
    assert [json.loads(x)["phase"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == ["sft"]


def test_a_torn_last_record_is_dropped_and_the_learner_resumes(tmp_path):
    """A kill or a full disk during an append leaves half a line at the end of a record: the next
    start drops it (and says so) instead of failing every start after; a bad line elsewhere is
    an error naming the file and line."""
    from raypost.utils.metrics import read_metrics

    for step in range(1, 4):
        log_trained(tmp_path, step, [f"s{step}"])
    with open(tmp_path / "trained_samples.jsonl", "a") as fh:
        fh.write('{"step": 4, "ids": ["s4"')  # torn: no closing brackets, no newline
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "phase": "grpo"}\n{"step": 2, "pha')
    assert read_metrics(tmp_path / "metrics.jsonl") == [{"step": 1, "phase": "grpo"}]
    assert rewind_logs(tmp_path, 3, "grpo") == 2  # the two torn lines
    trained = [json.loads(x) for x in (tmp_path / "trained_samples.jsonl").read_text().splitlines()]
    assert [r["step"] for r in trained] == [1, 2, 3]
    log_trained(tmp_path, 4, ["s4"])  # the next append starts on a line of its own
    assert json.loads((tmp_path / "trained_samples.jsonl").read_text().splitlines()[-1]) == {"step": 4, "ids": ["s4"]}
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2 is not JSON"):
        rewind_logs(tmp_path, 3, "grpo")


def test_a_resume_with_another_data_order_is_refused_naming_the_fields():
    """A checkpoint records what its data order depends on; a resumed run whose dataset, seed or
    global batch changed would read the cursor against another order, so it stops and names
    them. Evaluation settings and the run's length may change."""
    from raypost.config.base import build
    from raypost.config.grpo import GRPOConfig
    from raypost.config.pipelines import SFTConfig
    from raypost.train.order import check_order, order_of

    sft = SFTConfig().model_dump(mode="json")
    recorded = order_of("sft", sft)
    assert {"data.synthetic.num_train", "run.seed", "train.epochs", "optim.micro_batch_size"} <= recorded.keys()
    assert not any("eval" in k for k in recorded) and "optim.lr" not in recorded
    longer = build(SFTConfig, {"train": {"max_steps": 5}, "data": {"max_eval_samples": 7}, "optim": {"lr": 0.1}})
    check_order(recorded, order_of("sft", longer.model_dump(mode="json")), 10)  # passes
    other = build(SFTConfig, {"run": {"seed": 3}, "optim": {"micro_batch_size": 2}}).model_dump(mode="json")
    with pytest.raises(ValueError, match=r"step 10.*optim.micro_batch_size: 4 in the checkpoint, 2 now; run.seed: 0"):
        check_order(recorded, order_of("sft", other), 10)
    check_order({}, order_of("sft", other), 10)  # a checkpoint from before the check
    grpo = order_of("grpo", GRPOConfig().model_dump(mode="json"))
    assert "algo.prompts_per_step" in grpo and "optim.micro_batch_size" not in grpo and "algo.steps" not in grpo


def test_a_restored_rank_draws_what_the_uninterrupted_one_would_have(tmp_path):
    """Each rank's torch, Python and NumPy random state goes into its checkpoint and comes back."""
    import random

    import numpy as np
    import torch

    from raypost.train.rng import load_rng, save_rng

    def draws() -> tuple:
        return torch.rand(3).tolist(), random.random(), np.random.rand(2).tolist(), np.random.randn()

    torch.manual_seed(1), random.seed(2), np.random.seed(3)
    np.random.randn()  # a cached Gaussian in NumPy's state
    save_rng(tmp_path, rank=1)
    want = draws()
    draws()  # the state moves on, as a failed attempt's steps would move it
    assert load_rng(tmp_path, rank=1) and draws() == want
    assert not load_rng(tmp_path, rank=0)  # no state for a rank that saved none


def test_a_resumed_grpo_run_must_reproduce_its_prompt_order(tmp_path):
    """The prompt order is recorded when the run starts; a resumed run that would draw another
    (changed data or seed) stops before training, naming where the orders part."""
    from raypost.phases.grpo import PROMPT_ORDER_FILE, record_prompt_order

    record_prompt_order(tmp_path, ["a", "b", "c"])
    record_prompt_order(tmp_path, ["a", "b", "c", "d"])  # a longer run extends it
    assert json.loads((tmp_path / PROMPT_ORDER_FILE).read_text()) == ["a", "b", "c", "d"]
    record_prompt_order(tmp_path, ["a", "b"])  # a shorter one keeps it
    with pytest.raises(ValueError, match=r"position 1: 'b' then, 'x' now"):
        record_prompt_order(tmp_path, ["a", "x", "c"])


HOLD_RUN = """
import sys, time
from raypost.utils.runlock import hold_run
hold_run(sys.argv[1])
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


def test_a_second_driver_of_a_run_waits_for_the_first_then_is_refused(tmp_path):
    """Two drivers of one run folder would overwrite each other's checkpoints: the second waits
    up to its deadline for the first to end, takes the folder if it does, and otherwise is refused
    with the holder named."""
    import subprocess
    import sys

    from raypost.utils.runlock import RunInUseError, hold_run

    def holder(seconds: float) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-c", HOLD_RUN, str(tmp_path), str(seconds)], stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout.readline().strip() == "held"
        return proc

    first = holder(600)
    try:
        with pytest.raises(RunInUseError, match=rf"in use by another raypost driver \(pid {first.pid} on .*--run.name"):
            hold_run(tmp_path, wait_s=0.5)
    finally:
        first.kill()  # ours: started above
        first.wait()
    brief = holder(1.0)  # ends while the next driver waits
    fd = hold_run(tmp_path, wait_s=30)
    brief.wait()
    assert f"pid {os.getpid()}" in (tmp_path / ".raypost.lock").read_text()
    os.close(fd)


def test_rollout_policy_follows_the_pin_else_queue_depth(ray_cluster):
    from raypost.serve.scaling import pin_replicas, pinned_replicas, rollout_policy

    ctx = SimpleNamespace(
        app_name="rollout-policy-test",
        current_num_replicas=1,
        target_num_replicas=1,
        total_num_requests=9.0,
        config=SimpleNamespace(get_target_ongoing_requests=lambda: 4.0),
    )
    assert rollout_policy(ctx) == (3, {})  # ceil(9 / 4)
    pin_replicas("rollout-policy-test", 2)
    try:
        assert pinned_replicas("rollout-policy-test") == 2
        assert rollout_policy(ctx) == (2, {})
        ctx.total_num_requests = 0.0
        assert rollout_policy(ctx) == (2, {})  # the pin holds even when idle
    finally:
        pin_replicas("rollout-policy-test", None)
    assert pinned_replicas("rollout-policy-test") is None
    assert rollout_policy(ctx) == (0, {})


def test_rollout_autoscaling_range_is_validated():
    from raypost.config import ConfigError, build
    from raypost.config.serve import RolloutConfig

    assert build(RolloutConfig, {"num_replicas": 1, "autoscale_max_replicas": 2}).max_replicas == 2
    with pytest.raises(ConfigError, match="autoscale_max_replicas"):
        build(RolloutConfig, {"num_replicas": 3, "autoscale_max_replicas": 2})
