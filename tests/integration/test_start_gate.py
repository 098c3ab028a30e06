"""The start gate between an RL job's driver and its learner's ranks (``raypost.utils.gate``), on
a real Ray actor: ranks in other processes wait until the driver opens it, raise the error it
was opened with, and give up at their deadline naming the setting. (How the job uses it, with
fakes: tests/unit/phases/test_served.py; every GRPO job test runs through it.)"""

from __future__ import annotations

import time

import pytest


def _ranks(gate, n: int = 2) -> list:
    """``n`` processes waiting at ``gate`` as a learner's ranks do; their refs."""
    import ray

    @ray.remote(num_cpus=0)
    def rank(g):
        try:
            return ("went", g.wait())
        except (RuntimeError, TimeoutError) as err:
            return (type(err).__name__, str(err))

    return [rank.remote(gate) for _ in range(n)]


@pytest.mark.timeout(120)
def test_ranks_wait_until_the_driver_opens_the_gate(ray_cluster):
    import ray

    from raypost.utils.gate import StartGate

    gate = StartGate.create(timeout_s=60)
    ranks = _ranks(gate)
    ready, _ = ray.wait(ranks, num_returns=len(ranks), timeout=2.0)
    assert ready == [], "a rank went before the gate opened"
    t0 = time.monotonic()
    assert gate.open() is True and gate.open("late") is False  # the first call decides
    got = ray.get(ranks, timeout=30)
    assert [g[0] for g in got] == ["went", "went"]
    assert time.monotonic() - t0 < 10
    assert ray.get(_ranks(gate, 1), timeout=30)[0][0] == "went", "a rank that comes after it opened goes at once"
    gate.close()


@pytest.mark.timeout(120)
def test_ranks_raise_the_error_the_gate_was_opened_with(ray_cluster):
    import ray

    from raypost.utils.gate import StartGate

    gate = StartGate.create(timeout_s=60)
    ranks = _ranks(gate)
    gate.open("DeploymentFailed: the rollout replica could not load the model")
    for kind, msg in ray.get(ranks, timeout=30):
        assert kind == "RuntimeError"
        assert msg == (
            "the job stopped before the learner's first step: "
            "DeploymentFailed: the rollout replica could not load the model"
        )
    gate.close()


@pytest.mark.timeout(120)
def test_a_rank_gives_up_at_its_deadline_naming_the_setting(ray_cluster):
    import ray

    from raypost.utils.gate import StartGate

    gate = StartGate.create(timeout_s=1.0)
    t0 = time.monotonic()
    ((kind, msg),) = ray.get(_ranks(gate, 1), timeout=60)
    assert kind == "TimeoutError" and "rollout.ready_timeout_s" in msg and "waited 1 s" in msg
    assert time.monotonic() - t0 < 30
    gate.close()
    with pytest.raises(RuntimeError, match="driver ended before the learner's first step"):
        gate.wait()
