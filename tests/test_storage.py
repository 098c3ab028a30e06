"""Runs stored at a URI (``run.storage_path: s3://...``; ``raypost.utils.storage``), against a real
S3 endpoint on 127.0.0.1 (moto_server, started and stopped by this module): the working copy
maps back to its URI, the mirror leaves checkpoints to Ray Train (and fetches only their HF
exports), and an SFT run stored in S3 resumes on a machine that has none of its files."""

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
from tests.conftest import TINY, run_pipeline

@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """An S3 endpoint (moto_server) with one bucket; yields its URI options."""
    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    with log.open("w") as fh:
        proc = subprocess.Popen([str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(port)],
                                stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.time() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"moto_server did not start: {log.read_text()[-2000:]}")
                time.sleep(0.2)
        from pyarrow import fs  # credentials: tests/conftest.py (any, for moto)

        s3fs, _ = fs.FileSystem.from_uri(f"s3://runs?endpoint_override=127.0.0.1:{port}&scheme=http"
                                         "&allow_bucket_creation=true")
        s3fs.create_dir("runs")
        yield {"query": f"endpoint_override=127.0.0.1:{port}&scheme=http", "fs": s3fs}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def keys(s3fs, prefix: str) -> set[str]:
    from pyarrow import fs

    found = s3fs.get_file_info(fs.FileSelector(prefix, recursive=True, allow_not_found=True))
    return {f.path[len(prefix) + 1:] for f in found if f.type == fs.FileType.File}


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
    for rel, text in {"metrics.jsonl": "{}\n", "warmup/metrics.jsonl": "{}\n",
                      "checkpoint_1/hf/model.safetensors": "w", "checkpoint_1/ds/states.pt": "s"}.items():
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


def sft(address: str, uri: str, steps: int) -> str:
    args = ["--run.storage_path", uri, "--run.name", "s", "--run.wandb_mode", "disabled", "--train.max_steps", str(steps),
            "--run.checkpoint_every", "2", "--run.log_every", "1", "--data.synthetic.num_train", "200",
            "--data.synthetic.num_eval", "8", "--data.max_seq_len", "96", "--optim.micro_batch_size", "4",
            "--eval.max_new_tokens", "8", "--resources.num_workers", "1", "--resources.cpus_per_worker", "1",
            *[a for k, v in TINY.items() for a in (f"--model.tiny.{k}", str(v))]]
    proc = run_pipeline("sft.py", args, address, timeout=900)
    return proc.stdout + proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_an_sft_run_stored_in_s3_resumes_on_a_machine_without_its_files(s3, ray_cluster, tmp_path, monkeypatch):
    """The first run keeps everything in the bucket: Ray Train's checkpoints (written by the
    worker), metrics and report (mirrored). A second run of the same name, with more steps, from
    an empty working copy (another machine), resumes at the last checkpoint from the bucket and
    trains only the new steps; its records continue the first run's."""
    from raypost.utils import storage

    uri = f"s3://runs/team?{s3['query']}"
    monkeypatch.setenv("RAYPOST_STORAGE_CACHE", str(tmp_path / "machine-a"))  # the driver's working copies
    sft(ray_cluster, uri, steps=4)
    stored = keys(s3["fs"], "runs/team/s")
    assert {"metrics.jsonl", "report.json", "loss.png", "config.yaml"} <= stored
    ckpts = {k.split("/")[0] for k in stored if k.startswith("checkpoint_") and "/" in k}  # steps 2 and 4
    assert len(ckpts) == 2 and sum(f"{c}/hf/model.safetensors" in stored for c in ckpts) == 1
    # The driver's working copy holds the final checkpoint's export (downloaded) and the report.
    local = storage.working_copy(uri).relative_to(storage.cache_root())
    assert list((tmp_path / "machine-a" / local / "s").glob("checkpoint_*/hf/model.safetensors"))
    monkeypatch.setenv("RAYPOST_STORAGE_CACHE", str(tmp_path / "machine-b"))  # a machine without the run's files
    out = sft(ray_cluster, uri, steps=6)
    assert "resumed at step 4" in out
    monkeypatch.setenv("RAYPOST_STORAGE_CACHE", str(tmp_path / "machine-c"))
    run = storage.working_copy(uri) / "s"
    storage.pull(run, exports=False)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if "loss" in r]
    assert steps == sorted(set(steps)) and steps[-1] == 6 and 1 in steps, steps
    assert json.loads((run / "report.json").read_text())["steps"] == 6
