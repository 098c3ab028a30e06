"""The GRPO job's start-up (``phases.grpo.served``): the Serve apps deploy and the held-out pass
before training runs on a thread while the learner starts and waits at its gate. Serve, the gate's
actor and the learner are fakes here: the order of calls and which error surfaces are the logic.
The real gate is tested on Ray in tests/integration/test_start_gate.py."""

from __future__ import annotations

import threading

import pytest

from raypost.config.grpo import GRPOConfig
from raypost.phases import grpo as grpo_phase
from raypost.serve import apps


class FakeGate:
    """The gate's interface on a threading.Event; records how it was opened."""

    def __init__(self) -> None:
        self.event, self.errors = threading.Event(), []

    def open(self, error: str | None = None) -> bool:
        if self.event.is_set():
            return False
        self.errors.append(error)
        self.event.set()
        return True

    def wait(self) -> float:
        assert self.event.wait(10), "the gate never opened"
        if self.errors[0] is not None:
            raise RuntimeError(f"the job stopped before the learner's first step: {self.errors[0]}")
        return 0.0

    def close(self) -> None:
        pass


@pytest.fixture
def fakes(monkeypatch):
    calls: list[str] = []
    gate = FakeGate()

    class Channel:
        def close(self) -> None:
            calls.append("close weights")

    monkeypatch.setattr(grpo_phase.StartGate, "create", lambda timeout_s: gate)
    monkeypatch.setattr(grpo_phase, "weight_channel", lambda cfg: Channel())
    monkeypatch.setattr(grpo_phase, "started_here", lambda: True)
    monkeypatch.setattr(apps, "delete", lambda names, wait=True: calls.append(f"delete {','.join(names)} wait={wait}"))
    return calls, gate


def test_the_learner_starts_beside_the_deploy_and_waits_for_the_pass_before_training(fakes, monkeypatch):
    """The learner starts while the apps deploy; it passes the gate only after the deploy and the
    held-out pass; the pass's result comes back; then the apps are deleted (without waiting: the
    job's own Ray instance) and the pushed weights removed."""
    calls, gate = fakes
    deploying = threading.Event()

    def deploy(targets, *a):
        calls.append("deploy " + ",".join(t.name for t in targets))
        deploying.set()

    def first():
        assert not gate.event.is_set(), "the gate opened before the held-out pass ran"
        calls.append("held-out pass")
        return {"accuracy": 0.25}

    monkeypatch.setattr(apps, "deploy", deploy)
    with grpo_phase.served(GRPOConfig(), "warm", first=first) as startup:
        calls.append("learner starts")
        startup.gate.wait()
        calls.append("learner's first step")
        assert startup.first.result() == {"accuracy": 0.25}
    assert deploying.is_set() and gate.errors == [None]
    assert calls[0] == "close weights" and calls[-2:] == ["delete grpo-rollout,grpo-reward wait=False", "close weights"]
    middle, deploy = calls[1:-2], "deploy grpo-rollout,grpo-reward"
    assert sorted(middle) == sorted([deploy, "held-out pass", "learner starts", "learner's first step"])
    assert middle.index(deploy) < middle.index("held-out pass") < middle.index("learner's first step")


def test_a_failed_deploy_stops_the_waiting_learner_and_is_the_error_raised(fakes, monkeypatch):
    """A deploy that fails opens the gate with its error: the waiting learner raises, and the
    caller gets the deploy's error (the learner's is its context), the held-out pass never runs,
    and the apps are still deleted."""
    calls, gate = fakes

    def deploy(targets, *a):
        raise ValueError("reward.rewards[0].fn: no such function")

    monkeypatch.setattr(apps, "deploy", deploy)
    first = lambda: calls.append("held-out pass")  # noqa: E731
    with (
        pytest.raises(ValueError, match="no such function") as info,
        grpo_phase.served(GRPOConfig(), "warm", first=first) as startup,
    ):
        startup.gate.wait()  # the learner, as rl_loop waits
    assert "no such function" in gate.errors[0]
    assert "stopped before the learner's first step" in str(info.value.__cause__)
    assert calls == ["close weights", "delete grpo-rollout,grpo-reward wait=False", "close weights"]


def test_a_learner_that_fails_to_start_leaves_nothing_behind(fakes, monkeypatch):
    """The learner fails while the apps deploy: its error is raised, the thread is joined before
    the apps are deleted (none is left deploying), and the gate is opened with that error."""
    calls, gate = fakes
    monkeypatch.setattr(apps, "deploy", lambda targets, *a: calls.append("deploy"))
    first = lambda: calls.append("held-out pass")  # noqa: E731
    with pytest.raises(RuntimeError, match="learner died"), grpo_phase.served(GRPOConfig(), "warm", first=first):
        raise RuntimeError("learner died")
    assert "learner died" in gate.errors[0] or gate.errors[0] is None  # the thread may have opened it first
    assert calls[0] == "close weights" and calls[-2:] == ["delete grpo-rollout,grpo-reward wait=False", "close weights"]
    assert "deploy" in calls


def test_the_deploy_waits_for_serves_early_start(fakes, monkeypatch):
    """Serve's controller and proxy start on a thread during the data phase (``start_serve``);
    the deploy waits for that start, and an error of it is the job's error."""
    from concurrent.futures import Future

    calls, gate = fakes
    monkeypatch.setattr(apps, "deploy", lambda targets, *a: calls.append("deploy"))
    started: Future[None] = Future()
    with grpo_phase.served(GRPOConfig(), "warm", started=started) as startup:
        assert not startup.deployed.done(), "deployed before Serve had started"
        calls.append("serve started")
        started.set_result(None)
        startup.gate.wait()
    assert calls[1:3] == ["serve started", "deploy"]


def test_a_failed_early_serve_start_is_the_jobs_error(fakes, monkeypatch):
    from concurrent.futures import Future

    calls, gate = fakes
    monkeypatch.setattr(apps, "deploy", lambda targets, *a: calls.append("deploy"))
    failed: Future[None] = Future()
    failed.set_exception(RuntimeError("Serve's proxy could not bind 127.0.0.1:8000"))
    with pytest.raises(RuntimeError, match="could not bind"):  # noqa: SIM117 - the learner's wait raises inside
        with grpo_phase.served(GRPOConfig(), "warm", started=failed) as startup:
            startup.gate.wait()
    assert "could not bind" in gate.errors[0] and "deploy" not in calls
