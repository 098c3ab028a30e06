"""Runs stored at a URI (``run.storage_path: s3://...``; ``raypost.utils.storage``), against a real
S3 endpoint on 127.0.0.1 (moto_server, started and stopped by this module): the working copy
maps back to its URI, the mirror leaves checkpoints to Ray Train (and fetches only their HF
exports), a checkpoint is reported only once its records are in the bucket, and an SFT run
stored in S3 whose driver is killed resumes exactly (step and data position) on a machine that
has none of its files."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raypost.utils.local_head import free_port
from tests.conftest import ROOT, run_pipeline


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """An S3 endpoint (moto_server) with one bucket; yields its URI options."""
    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    with log.open("w") as fh:
        proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(port)],
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.time() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError as err:
                if time.time() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"moto_server did not start: {log.read_text()[-2000:]}") from err
                time.sleep(0.2)
        from pyarrow import fs  # credentials: tests/conftest.py (any, for moto)

        s3fs, _ = fs.FileSystem.from_uri(
            f"s3://runs?endpoint_override=127.0.0.1:{port}&scheme=http&allow_bucket_creation=true"
        )
        s3fs.create_dir("runs")
        yield {"query": f"endpoint_override=127.0.0.1:{port}&scheme=http", "fs": s3fs}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def keys(s3fs, prefix: str) -> set[str]:
    from pyarrow import fs

    found = s3fs.get_file_info(fs.FileSelector(prefix, recursive=True, allow_not_found=True))
    return {f.path[len(prefix) + 1 :] for f in found if f.type == fs.FileType.File}


def test_a_working_copy_maps_back_to_its_uri(monkeypatch, tmp_path):
    from raypost.utils import storage

    monkeypatch.setenv("RAYPOST_STORAGE_CACHE", str(tmp_path))
    uri = "s3://bucket/team/runs?endpoint_override=127.0.0.1:9000&scheme=http"
    local = storage.working_copy(uri) / "exp" / "warmup"
    assert local.parent.parent.parent == tmp_path
    filesystem, path = storage.remote_of(local)
    assert type(filesystem).__name__ == "S3FileSystem" and path == "bucket/team/runs/exp/warmup"
    assert storage.ray_storage(local.parent)["storage_path"] == "bucket/team/runs/exp"
    assert storage.remote_of(tmp_path / "uri-smith" / "runs") is None  # a folder that only looks like one
    # A local storage path is its own working copy, and nothing is mirrored.
    assert storage.working_copy(str(tmp_path / "runs")) == tmp_path / "runs" and storage.remote_of(tmp_path) is None
    assert storage.push(tmp_path) == 0 and storage.pull(tmp_path) == 0


def test_the_mirror_leaves_checkpoints_to_ray_and_fetches_their_exports(s3, monkeypatch, tmp_path):
    from raypost.utils import storage

    monkeypatch.setenv("RAYPOST_STORAGE_CACHE", str(tmp_path / "machine-a"))
    uri = f"s3://runs/mirror?{s3['query']}"
    run = storage.working_copy(uri) / "r"
    for rel, text in {
        "metrics.jsonl": "{}\n",
        "warmup/metrics.jsonl": "{}\n",
        "checkpoint_1/hf/model.safetensors": "w",
        "checkpoint_1/ds/states.pt": "s",
    }.items():
        (run / rel).parent.mkdir(parents=True, exist_ok=True)
        (run / rel).write_text(text)
    assert storage.push(run) == 2  # checkpoints are Ray Train's to write
    assert keys(s3["fs"], "runs/mirror/r") == {"metrics.jsonl", "warmup/metrics.jsonl"}
    assert storage.push(run) == 0  # nothing changed
    (run / "metrics.jsonl").write_text("{}\n{}\n")
    assert storage.push(run) == 1
    # Ray Train wrote a checkpoint there; a machine without the files fetches all but its DeepSpeed states.
    for rel in ("checkpoint_1/hf/model.safetensors", "checkpoint_1/ds/states.pt"):
        with s3["fs"].open_output_stream(f"runs/mirror/r/{rel}") as out:
            out.write(b"x")
    monkeypatch.setenv("RAYPOST_STORAGE_CACHE", str(tmp_path / "machine-b"))
    fresh = storage.working_copy(uri) / "r"
    assert storage.pull(fresh) == 3
    got = {str(p.relative_to(fresh)) for p in fresh.rglob("*") if p.is_file()}
    assert got == {"metrics.jsonl", "warmup/metrics.jsonl", "checkpoint_1/hf/model.safetensors"}
    assert (fresh / "metrics.jsonl").read_text() == "{}\n{}\n"


class _SavingEngine:
    """Stands in for a DeepSpeed engine: ``save_checkpoint`` writes one file."""

    def save_checkpoint(self, folder, tag, client_state):
        (Path(folder) / tag).mkdir(parents=True)
        (Path(folder) / tag / "states.pt").write_text(json.dumps(client_state))


def test_a_checkpoint_is_reported_only_after_its_records_are_in_the_bucket(s3, monkeypatch, tmp_path):
    """Once Ray Train records a checkpoint, the metrics and sample records of every step up to it
    are already at the URI: a driver killed the moment the checkpoint is recorded loses none."""
    import ray.train

    from raypost.train import checkpointing
    from raypost.utils import storage

    monkeypatch.setenv("RAYPOST_STORAGE_CACHE", str(tmp_path))
    run = storage.working_copy(f"s3://runs/order?{s3['query']}") / "r"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 4}\n')
    checkpointing.log_trained(run, 4, ["a", "b"])
    seen: dict[str, set[str]] = {}

    def report(metrics, checkpoint):
        seen["bucket"] = keys(s3["fs"], "runs/order/r")
        folder = Path(checkpoint.path)
        seen["checkpoint"] = {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}

    monkeypatch.setattr(ray.train, "report", report)
    state = checkpointing.ControllerState(step=4, cursor=8)
    checkpointing.save_and_report(_SavingEngine(), state, {"step": 4}, rank=0, run_dir=run)
    assert seen["bucket"] == {"metrics.jsonl", checkpointing.SAMPLES_FILE}
    assert seen["checkpoint"] == {
        f"{checkpointing.DS_TAG}/states.pt",
        checkpointing.STATE_FILE,
        checkpointing.METRICS_FILE,
        "rng/rank_0.pt",
    }
    seen.clear()
    checkpointing.save_and_report(_SavingEngine(), state, {"step": 4}, rank=1, run_dir=run)
    # only rank 0 adds the state and mirrors; every rank adds its random state
    assert seen["checkpoint"] == {f"{checkpointing.DS_TAG}/states.pt", "rng/rank_1.pt"}


def test_a_learner_restarted_on_another_node_keeps_the_buckets_records(s3, monkeypatch, tmp_path):
    """Rank 0 restarted on a node whose working copy lacks the run's records: at its start it takes
    the bucket's, so its next mirror extends them instead of putting its short copy over them."""
    from raypost.train import checkpointing
    from raypost.utils import storage

    uri = f"s3://runs/records?{s3['query']}"
    monkeypatch.setenv("RAYPOST_STORAGE_CACHE", str(tmp_path / "node-a"))
    run_a = storage.working_copy(uri) / "r"
    run_a.mkdir(parents=True)
    for step in range(1, 5):
        checkpointing.log_trained(run_a, step, [f"s{step}"])
    storage.push(run_a)  # mirrored with the checkpoint at step 4
    monkeypatch.setenv("RAYPOST_STORAGE_CACHE", str(tmp_path / "node-b"))
    run_b = storage.working_copy(uri) / "r"
    checkpointing.rewind_on_start(run_b, checkpointing.ControllerState(step=4, cursor=4), "sft")
    checkpointing.log_trained(run_b, 5, ["s5"])
    storage.push(run_b)
    with s3["fs"].open_input_stream(f"runs/records/r/{checkpointing.SAMPLES_FILE}") as f:
        steps = [json.loads(x)["step"] for x in f.read().decode().splitlines()]
    assert steps == [1, 2, 3, 4, 5]


def snapshot_steps(s3fs, prefix: str) -> list[int]:
    """Steps of the checkpoints Ray Train has recorded in the bucket (what a re-run resumes from)."""
    try:
        with s3fs.open_input_stream(f"{prefix}/checkpoint_manager_snapshot.json") as f:
            return [c["metrics"]["step"] for c in json.loads(f.read())["checkpoint_results"]]
    except (OSError, json.JSONDecodeError, KeyError):
        return []  # not written yet, or being written


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_an_sft_run_in_s3_resumes_after_its_driver_is_killed_on_a_machine_without_its_files(
    s3, ray_cluster, tmp_path, monkeypatch
):
    """The driver is killed after a checkpoint. The same command, on a machine with none of the
    run's files, resumes from the bucket at the right step and data position: every step is trained
    once in the end, the steps replayed after the checkpoint see the same examples as before, and
    no example is seen twice. The bucket holds everything: Ray Train's checkpoints (written by the
    workers), the metrics and sample records (mirrored at each checkpoint) and the report."""
    from raypost.utils import storage
    from tests.e2e.test_sft import read_jsonl, small_args

    uri = f"s3://runs/team?{s3['query']}"
    # The default tiny shape: steps slow enough that the kill lands mid-run. ZeRO-2 on 2 workers.
    args = small_args(tmp_path, "s", 2, steps=16, every=4, tiny=False)
    args[args.index("--run.storage_path") + 1] = uri
    monkeypatch.setenv("RAYPOST_STORAGE_CACHE", str(tmp_path / "machine-a"))  # the driver's working copies
    env = {
        **os.environ,
        "RAY_ADDRESS": ray_cluster,
        "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "token"),
        "WANDB_MODE": "disabled",
    }
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "pipelines" / "sft.py"), *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.time() + 400
    try:
        while not any(step >= 4 for step in snapshot_steps(s3["fs"], "runs/team/s")):
            assert proc.poll() is None, "driver ended before the kill"
            assert time.time() < deadline, "no checkpoint at step >= 4 recorded in the bucket within 400 s"
            time.sleep(0.5)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # only the driver we started
        proc.wait()
    before = read_jsonl(storage.working_copy(uri) / "s" / "trained_samples.jsonl")
    assert before and before[-1]["step"] < 16
    stored = keys(s3["fs"], "runs/team/s")
    # Mirrored by learner rank 0 before it reports the checkpoint; the driver's own files
    # (config, report) come at the end.
    assert {"metrics.jsonl", "trained_samples.jsonl"} <= stored and "report.json" not in stored

    monkeypatch.setenv("RAYPOST_STORAGE_CACHE", str(tmp_path / "machine-b"))  # a machine without the run's files
    out = run_pipeline("sft.py", args, ray_cluster, timeout=900)
    assert "resumed at step" in out.stdout + out.stderr
    # The driver's working copy holds the final checkpoint's export (downloaded) and the report.
    local = storage.working_copy(uri) / "s"
    assert list(local.glob("checkpoint_*/hf/model.safetensors")) and (local / "report.json").is_file()
    stored = keys(s3["fs"], "runs/team/s")
    assert {"metrics.jsonl", "report.json", "loss.png", "config.yaml"} <= stored
    assert any(k.startswith("checkpoint_") and k.endswith("/hf/model.safetensors") for k in stored)

    monkeypatch.setenv("RAYPOST_STORAGE_CACHE", str(tmp_path / "machine-c"))  # the records, as the bucket holds them
    run = storage.working_copy(uri) / "s"
    storage.pull(run, exports=False)
    rows = read_jsonl(run / "trained_samples.jsonl")
    # The log is rewound to the checkpoint on resume: it lists every step once, as the final
    # model learned it; steps replayed after the checkpoint saw the same examples as before.
    assert [r["step"] for r in rows] == list(range(1, 17))
    for old in before:
        assert rows[old["step"] - 1]["ids"] == old["ids"], f"step {old['step']} saw other data on resume"
    all_ids = [i for r in rows for i in r["ids"]]
    assert len(all_ids) == len(set(all_ids)), "an example was trained twice"
    steps = [r["step"] for r in read_jsonl(run / "metrics.jsonl") if r.get("phase") == "sft" and "loss" in r]
    assert steps == sorted(set(steps)) and steps[-1] == 16, "metrics of discarded steps were kept"
    assert json.loads((run / "report.json").read_text())["steps"] == 16
