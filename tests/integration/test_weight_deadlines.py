"""A weight push that can't hang and can be verified (issue 42): the learner's publish and a
replica's look-up of the board answer within rollout.weight_timeout_s, on a real Ray actor that
never answers (a replica's fetch and load: tests/unit/serve/test_rollout_replica.py); replicas acknowledge
the version they serve on the board, and the learner reads who is on which version."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
import torch


class Hung:
    """A board whose every call blocks far past the deadline."""

    def put(self, version: int, boxed: list) -> None:
        time.sleep(600)

    def latest(self) -> tuple:
        time.sleep(600)
        return 0, None


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["shm", "object_store"])
def test_a_board_that_never_answers_fails_within_the_weight_timeout(ray_cluster, tmp_path, transport):
    import ray

    from raypost.config.serve import RolloutConfig
    from raypost.weights import open_channel

    settings = {"transport": transport, **({"dir": str(tmp_path)} if transport == "shm" else {})}
    rollout = RolloutConfig(weights=settings, weight_timeout_s=1.0)
    chan = open_channel(rollout, f"deadline-{uuid.uuid4().hex[:8]}")
    chan._board = ray.remote(Hung).options(max_concurrency=4).remote()
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="did not record version 1 within rollout.weight_timeout_s=1"):
        chan.publish(1, {"w": torch.zeros(4)})
    with pytest.raises(TimeoutError):
        asyncio.run(chan.newer_than(0))
    assert time.monotonic() - t0 < 30
    chan.stop_serving()
    ray.kill(chan._board)


def test_replicas_acknowledge_the_version_they_serve(ray_cluster, tmp_path):
    from raypost.config.serve import RolloutConfig
    from raypost.weights import open_channel

    rollout = RolloutConfig(weights={"transport": "shm", "dir": str(tmp_path)})
    key = f"acks-{uuid.uuid4().hex[:8]}"
    learner, replica_a, replica_b = (open_channel(rollout, key) for _ in range(3))
    try:
        assert learner.served_versions() == {}  # nothing published: no board
        learner.publish(1, {"w": torch.zeros(4)})
        asyncio.run(replica_a.ack("a", 1))
        asyncio.run(replica_b.ack("b", 0))
        assert learner.served_versions() == {"a": 1, "b": 0}
        asyncio.run(replica_b.ack("b", 1))
        assert learner.served_versions() == {"a": 1, "b": 1}
        time.sleep(0.2)
        assert learner.served_versions(max_age_s=0.1) == {}  # replicas not heard from lately drop out
    finally:
        learner.stop_serving()
        learner.close()
