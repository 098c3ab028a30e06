"""The re-submission wrapper's decisions, on a scripted job server: a failed status poll is
retried, not taken for a lost job; a job still running when the server answers again is waited on,
never submitted a second time; a lost or failed job is submitted again, also one that a restarted head
reports RUNNING while its driver's node is dead. ``tests/e2e/test_recovery.py`` runs it on a real head."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from raypost.utils.resubmit import submit_until_done


class ScriptedServer:
    """Answers each status poll from ``script`` (a status, or an exception to raise)."""

    def __init__(self, script: list[Any], refusals: int = 0, dead_drivers: set[str] = frozenset()) -> None:
        self.script, self.submitted, self.refusals = list(script), [], refusals
        self.dead_drivers = set(dead_drivers)  # jobs whose driver's node the cluster holds dead

    def connect(self) -> ScriptedServer:
        """As ``_client`` does, wait until the server answers: the failures left are skipped."""
        while len(self.script) > 1 and isinstance(self.script[0], Exception):
            self.script.pop(0)
        return self

    def submit_job(self, entrypoint: str, runtime_env: Any = None) -> str:
        if self.refusals:  # Ray's job server before its job agent is up: nothing was submitted
            self.refusals -= 1
            raise RuntimeError(
                "Request failed with status code 500: No available agent to submit job, please try again later.."
            )
        self.submitted.append(entrypoint)
        return f"job-{len(self.submitted)}"

    def get_job_status(self, job_id: str) -> Any:
        step = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        if isinstance(step, Exception):
            raise step
        return SimpleNamespace(value=step)

    def driver_alive(self, job_id: str) -> bool:
        return job_id not in self.dead_drivers


def run(server: ScriptedServer, grace_s: float = 5.0) -> Any:
    return submit_until_done(
        "unused", "python job.py", max_attempts=3, poll_s=0.01, grace_s=grace_s, connect=server.connect
    )


@pytest.mark.timeout(30)
def test_a_failed_poll_is_retried_and_the_job_is_submitted_once():
    server = ScriptedServer(["RUNNING", ConnectionError("reset"), ConnectionError("reset"), "RUNNING", "SUCCEEDED"])
    out = run(server)
    assert out.status == "SUCCEEDED" and server.submitted == ["python job.py"] and len(out.attempts) == 1


@pytest.mark.timeout(30)
def test_a_job_still_running_after_the_server_comes_back_is_waited_on():
    # Polls fail past the grace (LOST); the server answers again and the job still runs: no copy.
    server = ScriptedServer(["RUNNING", *[ConnectionError("head away")] * 30, "RUNNING", "RUNNING", "SUCCEEDED"])
    out = run(server, grace_s=0.05)
    assert [a["status"] for a in out.attempts] == ["LOST", "SUCCEEDED"]
    assert server.submitted == ["python job.py"] and {a["job_id"] for a in out.attempts} == {"job-1"}


@pytest.mark.timeout(30)
def test_a_failed_job_is_submitted_again():
    server = ScriptedServer(["FAILED", "FAILED", "SUCCEEDED"])
    out = run(server)
    assert [a["status"] for a in out.attempts] == ["FAILED", "SUCCEEDED"] and len(server.submitted) == 2


@pytest.mark.timeout(30)
def test_a_job_server_with_no_agent_yet_is_asked_again_and_the_job_submitted_once():
    server = ScriptedServer(["RUNNING", "SUCCEEDED"], refusals=2)
    out = run(server)
    assert out.status == "SUCCEEDED" and server.submitted == ["python job.py"] and len(out.attempts) == 1


@pytest.mark.timeout(30)
def test_a_job_whose_driver_died_with_the_head_is_lost_though_it_reads_running():
    # A restarted head's job server reads RUNNING for good (Ray 2.60 fails the record only from a
    # job manager, which exists after a submission): the dead driver's node decides, once.
    server = ScriptedServer(["RUNNING", "RUNNING", "RUNNING", "SUCCEEDED"], dead_drivers={"job-1"})
    out = run(server)
    assert [(a["job_id"], a["status"]) for a in out.attempts] == [("job-1", "LOST"), ("job-2", "SUCCEEDED")]
    assert len(server.submitted) == 2
