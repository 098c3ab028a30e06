"""``rollout.weights.fallback`` on a real Ray cluster, and the collective server's concurrent
transfers. A replica that cannot reach the learner's weight server loads the same version from the
object store; a primary that fails on the learner's side still gets each version out through the
fallback; a replica whose workers stall holds one of the server's sending threads, not the others."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest
import torch

from raypost.config.serve import RolloutConfig


def state(version: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(version)
    return {
        "embed": torch.randn(300, 1024, generator=g),  # 1.2 MB: two buckets of 1 MiB
        "half": torch.randn(64, 64, generator=g).to(torch.bfloat16),
    }


class Loader:
    """A replica's ``load``: reads every tensor of a source through its transport's engine end
    (as an engine worker would), records (version, transport, tensors)."""

    def __init__(self) -> None:
        self.loads: list[tuple[int, str, dict[str, torch.Tensor]]] = []

    async def __call__(self, version: int, source: dict[str, Any]) -> None:
        from raypost.weights.channel import engine_tensors

        def read() -> dict[str, torch.Tensor]:
            return {k: v.clone() for k, v in engine_tensors(source, None)}

        self.loads.append((version, source["transport"], await asyncio.to_thread(read)))


def same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> bool:
    return got.keys() == want.keys() and all(torch.equal(got[k], v) for k, v in want.items())


def channels() -> tuple[Any, Any]:
    """A learner's and a replica's channel of one run: collective, the object store its fallback,
    1 MiB buckets, 30 s deadlines (the first publish starts the board's actor, which can take
    several seconds on a loaded 2-core machine; a 5 s deadline failed there in CI)."""
    from raypost.weights import open_channel

    settings = {"transport": "collective", "fallback": "object_store"}
    cfg = RolloutConfig.model_validate({"weight_bucket_mb": 1, "weight_timeout_s": 30, "weights": settings})
    key = f"raypost-test-{uuid.uuid4().hex[:8]}"
    return open_channel(cfg, key), open_channel(cfg, key)


@pytest.mark.timeout(300)
def test_a_replica_that_cannot_reach_the_weight_server_loads_the_version_from_the_fallback(ray_cluster):
    from raypost.weights.fallback import FallbackChannel

    learner, replica = channels()
    assert isinstance(learner, FallbackChannel) and replica.reload_deadline_s == 90
    load = Loader()
    try:
        learner.publish(1, state(1))
        assert asyncio.run(replica.reload(0, load)) == 1  # the collective transfer, as without a fallback
        assert [(v, t) for v, t, _ in load.loads] == [(1, "collective")] and same(load.loads[0][2], state(1))
        assert asyncio.run(replica.ack("r0", 1)) and learner.served_versions() == {"r0": 1}

        learner.publish(2, state(2))
        learner.primary.stop_serving()  # the board names version 2 at a server nobody answers
        t0 = time.monotonic()
        assert asyncio.run(replica.reload(1, load)) == 2
        assert [(v, t) for v, t, _ in load.loads[1:]] == [(2, "object_store")] and same(load.loads[1][2], state(2))
        assert time.monotonic() - t0 < replica.reload_deadline_s
    finally:
        replica.release()
        learner.stop_serving()
        learner.close()


@pytest.mark.timeout(300)
def test_a_primary_that_fails_on_the_learner_sends_the_version_through_the_fallback(ray_cluster):
    from raypost.weights import specs_of

    learner, replica = channels()
    load = Loader()

    def broken(version: int, specs: Any, buckets: Any) -> None:
        next(iter(buckets))  # takes the first bucket, then its server fails
        raise ConnectionError("injected: the weight server's port is blocked")

    try:
        learner.publish(1, state(1))
        learner.primary.publish_stream = broken
        s2 = state(2)
        learner.publish_stream(2, specs_of(s2), [{"embed": s2["embed"]}, {"half": s2["half"]}])
        assert len(learner.failures) == 1 and "port is blocked" in learner.failures[0]
        assert asyncio.run(learner.primary._latest())[0] == 1  # the primary never named version 2
        assert asyncio.run(replica.reload(0, load)) == 2
        assert [(v, t) for v, t, _ in load.loads] == [(2, "object_store")] and same(load.loads[0][2], s2)
    finally:
        replica.release()
        learner.stop_serving()
        learner.close()


def test_a_stalled_replica_holds_one_sending_thread_and_the_others_are_served():
    """Replica A takes a ticket and its workers never join (the server gives up at ``timeout_s``);
    replica B, asking after it, is sent its version while A's transfer still waits."""
    from raypost.weights import specs_of
    from raypost.weights.collective import WeightServer, receive, request

    server = WeightServer("127.0.0.1", timeout_s=4.0, concurrency=2)
    try:
        server.offer(3, specs_of(state(3)), [state(3)])
        stalled = request(server.address, workers=1)
        src = request(server.address, workers=1)
        assert same(dict(receive(src, 0)), state(3))
        assert [(r["ticket"], "error" in r) for r in server.sent] == [(src["ticket"], False)]  # A's still waits
        deadline = time.monotonic() + 30
        while len(server.sent) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [(r["ticket"], "error" in r) for r in server.sent] == [(src["ticket"], False), (stalled["ticket"], True)]
    finally:
        server.stop()
