"""Re-submit a Ray job until it succeeds: the automatic path after a head-node loss.

The driver of a Ray job runs on the head and dies with it. With GCS fault tolerance the
cluster comes back, but the job does not. This wrapper submits the job, waits for it, and
when it fails or the head disappears, waits for the job server to answer again and submits
the same entrypoint again. raypost pipelines resume from their latest checkpoint when run
again with the same run.name and run.storage_path. KubeRay's RayJob does the same with
``backoffLimit`` (cluster_configs/kuberay/rayjob-grpo.yaml).

  python -m raypost.utils.resubmit --address http://127.0.0.1:8265 --working-dir . --max-attempts 5 \\
      -- python pipelines/grpo.py --run.name my-grpo
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("raypost.resubmit")
TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}


@dataclass
class Outcome:
    """What happened: the final status and one entry per attempt (job id, status, seconds)."""

    status: str = "NOT_STARTED"
    attempts: list[dict[str, Any]] = field(default_factory=list)


def auth_headers() -> dict[str, str]:
    """Ray's auth token as an HTTP header (RAY_AUTH_TOKEN, else ~/.ray/auth_token), passed
    explicitly: Ray's client reads RAY_AUTH_MODE once per process, when it is first used."""
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        return {}
    token = os.environ.get("RAY_AUTH_TOKEN")
    path = Path.home() / ".ray" / "auth_token"
    if not token and path.exists():
        token = path.read_text().strip()
    return {"Authorization": f"Bearer {token}"} if token else {}


class JobServer:
    """Ray's job server, as the wrapper asks it: submit, a job's status, and whether the node its
    driver runs on is alive. A head that crashed takes its job's driver with it, but the restarted
    head's job server may report that job RUNNING for good (Ray 2.60: the record is only failed by a
    job manager, which a job agent creates at its first submission), so a RUNNING status alone
    does not say that the job lives."""

    def __init__(self, address: str) -> None:
        from ray.job_submission import JobSubmissionClient

        self.address = address.rstrip("/")
        self.client = JobSubmissionClient(address, headers=auth_headers())

    def submit_job(self, entrypoint: str, runtime_env: dict[str, Any] | None = None) -> str:
        return self.client.submit_job(entrypoint=entrypoint, runtime_env=runtime_env)

    def get_job_status(self, job_id: str) -> Any:
        return self.client.get_job_status(job_id)

    def driver_alive(self, job_id: str) -> bool:
        """False only when the job's driver ran on a node the cluster holds DEAD (the state API's
        node list); True while that is not known (no driver yet, a node list that did not answer)."""
        import json
        import urllib.request

        node = self.client.get_job_info(job_id).driver_node_id
        if not node:
            return True
        url = f"{self.address}/api/v0/nodes?limit=10000&detail=false"
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=auth_headers()), timeout=30) as resp:
                nodes = json.loads(resp.read())["data"]["result"]["result"]
        except (OSError, ValueError, KeyError, TypeError):
            return True
        return not any(n.get("node_id") == node and n.get("state") == "DEAD" for n in nodes)


def _client(address: str, wait_s: float) -> JobServer:
    """The job server, once it answers (waits up to ``wait_s``)."""
    deadline = time.time() + wait_s
    while True:
        try:
            return JobServer(address)
        except Exception as err:  # connection refused while the head is down
            if time.time() > deadline:
                raise TimeoutError(f"the job server at {address} did not answer within {wait_s:.0f} s") from err
            time.sleep(2.0)


NOT_SUBMITTED = ("No available agent to submit job",)  # the job server refused before taking the job


def _submit(client: Any, entrypoint: str, runtime_env: dict[str, Any] | None, wait_s: float, poll_s: float) -> str:
    """``client.submit_job``, retried for up to ``wait_s`` while the job server says it took nothing
    (a head whose job agent is not up yet); any other error is raised: the job may exist."""
    deadline = time.time() + wait_s
    while True:
        try:
            return client.submit_job(entrypoint, runtime_env)
        except RuntimeError as err:
            if not any(s in str(err) for s in NOT_SUBMITTED) or time.time() > deadline:
                raise
            log.warning("the job server took no job (%s); retrying", str(err)[:200])
            time.sleep(max(poll_s, 0.5))


def _wait(client: Any, job_id: str, poll_s: float, grace_s: float) -> str:
    """The job's terminal status, or "LOST" when the job server has not answered for ``grace_s``
    (one failed poll, a busy head or a dropped connection, is retried, not taken for a lost job),
    or when the node of the job's driver is dead, whatever its status says."""
    failing_since: float | None = None
    while True:
        try:
            status = str(client.get_job_status(job_id).value)
            alive = status in TERMINAL or client.driver_alive(job_id)
            failing_since = None
        except Exception as err:  # noqa: BLE001 - the head may be away for a while, or for good
            failing_since = failing_since or time.time()
            if time.time() - failing_since > grace_s:
                return "LOST"
            log.warning("status poll of %s failed (%s); retrying for up to %.0f s", job_id, err, grace_s)
            time.sleep(poll_s)
            continue
        if status in TERMINAL:
            return status
        if not alive:
            log.warning("%s reads %s, but the node of its driver is dead: the job is lost", job_id, status)
            return "LOST"
        time.sleep(poll_s)


def _still_running(client: Any, job_id: str) -> bool:
    """Whether the job a lost attempt submitted is still alive after the job server came back (a
    second copy of it would share its run folder and Serve apps)."""
    try:
        return str(client.get_job_status(job_id).value) not in TERMINAL and client.driver_alive(job_id)
    except Exception:  # noqa: BLE001 - a new head that never saw the job
        return False


def submit_until_done(
    address: str,
    entrypoint: str,
    runtime_env: dict[str, Any] | None = None,
    max_attempts: int = 5,
    poll_s: float = 2.0,
    wait_head_s: float = 600.0,
    grace_s: float = 60.0,
    connect: Callable[[], Any] | None = None,
) -> Outcome:
    """Submit ``entrypoint`` until one attempt succeeds, a user stops it, or attempts run out. A
    job whose status polls failed for ``grace_s`` counts as lost; when the job server answers
    again and that job is still running, it is waited on rather than submitted again.
    ``connect`` (tests) replaces the job-server client."""
    connect = connect or (lambda: _client(address, wait_head_s))
    out, job_id = Outcome(), None
    for attempt in range(1, max_attempts + 1):
        client = connect()
        t0 = time.time()
        if job_id is not None and _still_running(client, job_id):
            log.info("attempt %d/%d: %s is still running; waiting on it", attempt, max_attempts, job_id)
        else:
            job_id = _submit(client, entrypoint, runtime_env, wait_head_s, poll_s)
            log.info("attempt %d/%d: submitted %s", attempt, max_attempts, job_id)
        status = _wait(client, job_id, poll_s, grace_s)
        out.attempts.append({"job_id": job_id, "status": status, "seconds": round(time.time() - t0, 1)})
        out.status = status
        if status in ("SUCCEEDED", "STOPPED"):
            return out
        log.warning("attempt %d/%d ended %s; re-submitting the same command", attempt, max_attempts, status)
    return out


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        sys.exit("usage: python -m raypost.utils.resubmit [options] -- ENTRYPOINT ...")
    split = argv.index("--")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--address", required=True, help="job server URL, e.g. http://127.0.0.1:8265")
    parser.add_argument("--working-dir", default=None, help="uploaded as the job's working_dir")
    parser.add_argument("--max-attempts", type=int, default=5)
    parser.add_argument("--wait-head-s", type=float, default=600.0, help="how long to wait for a head to come back")
    parser.add_argument("--grace-s", type=float, default=60.0, help="how long failed status polls are retried")
    args = parser.parse_args(argv[:split])
    if args.max_attempts < 1:
        parser.error(f"--max-attempts must be >= 1, got {args.max_attempts}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    import shlex

    env = {"working_dir": args.working_dir} if args.working_dir else None
    out = submit_until_done(
        args.address,
        shlex.join(argv[split + 1 :]),
        env,
        args.max_attempts,
        wait_head_s=args.wait_head_s,
        grace_s=args.grace_s,
    )
    print(f"{out.status} after {len(out.attempts)} attempt(s): {out.attempts}", flush=True)
    sys.exit(0 if out.status == "SUCCEEDED" else 1)


if __name__ == "__main__":
    main()
