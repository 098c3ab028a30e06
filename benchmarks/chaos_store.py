"""The recovery drills of ``benchmarks.chaos`` that hit what a GRPO run keeps and leans on: its
records torn by a kill, its disk full during a checkpoint, the GCS gone while it trains. Each
measures, like the other GRPO drills, against the expected set of trained prompts."""

from __future__ import annotations

import errno
import subprocess
import time
from pathlib import Path
from typing import Any

from benchmarks.chaos_grpo import GRPOJob, _auth_env, eta_args
from raypost.utils.local_head import LocalHead
from raypost.utils.local_redis import LocalRedis
from raypost.utils.metrics import read_records

RECORDS = ("trained_samples.jsonl", "metrics.jsonl")
TORN = '{"phase": "grpo", "step": 999, "ids": ["cut-sh'  # an append cut short: no closing, no newline
TORN_WARNING = "dropped a torn last line"


def _stop(job: GRPOJob, job_id: str, timeout: float = 120.0) -> str:
    """`ray job stop` (SIGTERM to the driver, SIGKILL after Ray's grace) and wait for it to end."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(job.head.dashboard_url)
    client.stop_job(job_id)
    deadline = time.time() + timeout
    while time.time() < deadline:
        status = str(client.get_job_status(job_id).value)
        if status in ("STOPPED", "FAILED", "SUCCEEDED"):
            return status
        time.sleep(0.5)
    raise TimeoutError(f"{job.name}: job {job_id} still running {timeout:.0f} s after `ray job stop`")


def _records_clean(job: GRPOJob) -> bool:
    """Every line of the run's records parses and none is the injected one."""
    for name in RECORDS:
        rows, torn = read_records(job.run / name)
        if torn or any(r.get("step") == 999 for r in rows):
            return False
    return True


def torn_drill(root: Path, eta: int) -> dict[str, Any]:
    """Stop a job mid-run, leave a torn last line in both of its records (what a kill during an
    append leaves), run the same command again: it drops the torn lines, says so, and resumes."""
    with LocalHead(num_cpus=4) as head:
        _auth_env(head)
        job = GRPOJob(head, root, "torn-record", 8, ["--run.checkpoint_every", "2", *eta_args(eta)])
        first = job.submit()
        job.wait_step(3, first)
        _stop(job, first)
        step_at_fault = max(r["step"] for r in job.steps_done())
        for name in RECORDS:
            with (job.run / name).open("a") as fh:
                fh.write(TORN)
        t_fault = time.time()
        second = job.submit()
        status, logs = job.wait_done(second)
    return {
        "fault": "torn last line in both records",
        "injected": len(RECORDS),
        "survived": status == "SUCCEEDED" and _records_clean(job),
        "torn_lines_reported": logs.count(TORN_WARNING),
        **job.audit(t_fault, step_at_fault, logs),
    }


class Tmpfs:
    """A tmpfs of ``size_mb`` mounted at ``path`` (needs root), unmounted on exit."""

    def __init__(self, path: Path, size_mb: int) -> None:
        self.path, self.size_mb = path, size_mb

    def __enter__(self) -> Tmpfs:
        self.path.mkdir(parents=True, exist_ok=True)
        cmd = ["mount", "-t", "tmpfs", "-o", f"size={self.size_mb}m", "tmpfs", str(self.path)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        if proc.returncode != 0:
            raise RuntimeError(f"the disk drill mounts a small tmpfs and needs root: {proc.stderr.strip()}")
        return self

    def fill(self, keep_bytes: int = 0) -> Path:
        """Write a filler file until the disk is full (less ``keep_bytes``); returns its path."""
        filler = self.path / "filler.bin"
        chunk = b"\0" * (1 << 20)
        with filler.open("wb") as fh:
            try:
                while True:
                    fh.write(chunk)
                    fh.flush()
            except OSError as err:
                if err.errno != errno.ENOSPC:
                    raise
        if keep_bytes:
            size = filler.stat().st_size
            with filler.open("r+b") as fh:
                fh.truncate(max(0, size - keep_bytes))
        return filler

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["umount", "-l", str(self.path)], capture_output=True, timeout=60)


def disk_drill(root: Path, eta: int, size_mb: int = 512) -> dict[str, Any]:
    """The run folder on a small tmpfs, filled up once the job has checkpointed: the job must fail
    with an error that names the full disk, within its deadline (never hang); with the space freed,
    the same command resumes from the last checkpoint that was written whole."""
    with LocalHead(num_cpus=4) as head, Tmpfs(root / "disk", size_mb) as disk:
        _auth_env(head)
        job = GRPOJob(head, disk.path, "full-disk", 8, ["--run.checkpoint_every", "2", *eta_args(eta)])
        first = job.submit()
        job.wait_step(3, first)
        filler = disk.fill()
        t_fault = time.time()
        step_at_fault = max(r["step"] for r in job.steps_done())
        status, first_logs = job.wait_done(first, timeout=600)
        fail_s = time.time() - t_fault
        filler.unlink()
        second = job.submit()
        status2, logs = job.wait_done(second)
        audit = job.audit(t_fault, step_at_fault, logs)
        clean = _records_clean(job)
    return {
        "fault": "disk full during a checkpoint",
        "injected": 1,
        "first_status": status,
        "first_error_names_disk": "No space left on device" in first_logs,
        "first_failed_s": round(fail_s, 1),
        "survived": status2 == "SUCCEEDED" and clean,
        **audit,
        **({} if status2 == "SUCCEEDED" else {"resumed_log_tail": logs[-3000:]}),
    }


def gcs_job_drill(root: Path, eta: int, outage_s: float) -> dict[str, Any]:
    """Only the GCS is down for ``outage_s`` while a GRPO job trains (GCS fault tolerance on
    Redis); the GCS restarts and the job must finish with nothing lost."""
    with LocalRedis() as redis, LocalHead(num_cpus=4, redis_address=redis.address, block=False) as head:
        _auth_env(head)
        job = GRPOJob(head, root, "gcs-outage", 8, eta_args(eta))
        job_id = job.submit()
        job.wait_step(2, job_id)
        step_at_fault = max(r["step"] for r in job.steps_done())
        t_fault = time.time()
        spec = head.kill_gcs()
        time.sleep(outage_s)
        head.restart_gcs(spec)
        steps_in_outage = sum(t_fault < r["time"] < t_fault + outage_s for r in job.steps_done())
        status, logs = job.wait_done(job_id)
    return {
        "fault": f"GCS down {outage_s:.0f} s during a job",
        "injected": 1,
        "survived": status == "SUCCEEDED",
        "outage_s": outage_s,
        "steps_during_outage": steps_in_outage,
        **job.audit(t_fault, step_at_fault, logs),
    }
