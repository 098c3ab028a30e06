"""The rollout replica's drain-and-reload logic with a fake engine injected in place of vLLM:
a newer version waits for the requests in flight, is loaded once however many requests ask,
resets the prefix cache, and every request reports the version that generated it."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from raypost.serve.rollout_app import RolloutServer, Sampling
from raypost.weights import WeightChannel
from raypost.weights.fallback import FallbackChannel


class FakeEngine:
    """What the replica calls on vLLM's AsyncLLM: a load through the worker extension, a prefix
    cache reset; generation takes ``gen_s`` and reports the version loaded when it started."""

    def __init__(self, server: Any, gen_s: float = 0.05) -> None:
        self.server, self.gen_s = server, gen_s
        self.loaded: list[tuple[int, int]] = []  # (version, requests in flight at the load)
        self.resets = 0
        self.weights = 0
        self.errored = False
        self.fail_versions: set[int] = set()
        self.load_s = 0.01

    async def collective_rpc(self, method: str, args: tuple) -> list[bool]:
        assert method == "raypost_load"
        if args[0]["version"] in self.fail_versions or args[0]["transport"] in self.fail_versions:
            self.weights = -1  # half loaded
            raise ConnectionError("the learner's weight server went away mid-transfer")
        self.loaded.append((args[0]["version"], self.server._inflight))
        await asyncio.sleep(self.load_s)
        self.weights = args[0]["version"]
        return [True]

    async def reset_prefix_cache(self) -> None:
        self.resets += 1

    async def sample(self, prompt: list[int], n: int) -> list[dict[str, Any]]:
        weights = self.weights
        await asyncio.sleep(self.gen_s)
        assert self.weights == weights, "the weights changed under a request in flight"
        return [{"token_ids": [weights], "text": "", "finish_reason": "length", "logprobs": [-1.0]}] * n


class FakeChannel:
    """A board with one published version, set by the test (its loads: ``WeightChannel.reload``)."""

    reload = WeightChannel.reload

    def __init__(self, transport: str = "fake") -> None:
        self.transport, self.timeout_s = transport, 30.0
        self.published = 0
        self.fetches = 0
        self.acks: list[int] = []  # the versions the replica said it serves, in order
        self.board = False  # the learner has published (version 0: its restored weights)
        self.fail_fetches = 0

    async def ack(self, replica: str, version: int) -> bool:
        if not self.board:  # no board before the learner's first publish
            return False
        self.acks.append(version)
        return True

    async def newer_than(self, have: int) -> bool:
        return self.published not in (0, have)

    async def fetch(self, have: int) -> tuple[int, dict[str, Any] | None]:
        self.fetches += 1
        if self.fail_fetches:
            self.fail_fetches -= 1
            raise ConnectionError("the object store could not be reached")
        if self.published in (0, have):
            return have, None
        return self.published, {"transport": self.transport, "version": self.published}

    async def _latest(self) -> tuple[int, list[Any] | None]:
        return self.published, [self.transport] if self.board else None


def replica(
    channel: FakeChannel | FallbackChannel | None,
    gen_s: float = 0.05,
    drain_s: float = 30.0,
    weight_s: float = 30.0,
    request_s: float = 900.0,
) -> Any:
    """A RolloutServer built around the fakes, without its constructor (which starts vLLM)."""
    server = RolloutServer.func_or_class.__new__(RolloutServer.func_or_class)
    server.engine = FakeEngine(server, gen_s)
    server.channel, server.version, server._inflight, server._lock = channel, 0, 0, asyncio.Lock()
    server._started = {}
    server.cfg = SimpleNamespace(drain_timeout_s=drain_s, weight_timeout_s=weight_s, request_timeout_s=request_s)
    server._broken = None
    if isinstance(channel, FakeChannel):
        channel.reload_deadline_s = weight_s

    async def sample(prompt_ids: list[int], n: int, s: Sampling) -> list[dict[str, Any]]:
        return await server.engine.sample(prompt_ids, n)

    server._sample = sample
    return server


def served_versions(out: list[dict[str, Any]]) -> set[tuple[int, int]]:
    """(version reported, version whose weights generated it) of each answer."""
    return {(g["version"], c["token_ids"][0]) for g in out for c in g["completions"]}


@pytest.mark.timeout(30)
def test_a_new_version_waits_for_the_requests_in_flight_and_loads_once():
    async def run() -> None:
        chan = FakeChannel()
        server = replica(chan)
        await server.generate([[1]], 1)  # before the learner's first publish: nothing to say
        assert chan.acks == []
        chan.board = True  # the learner published its starting weights as version 0
        await server.generate([[1]], 1)
        chan.published = 1
        first = await asyncio.gather(*[server.generate([[1, 2]], 2) for _ in range(8)])
        assert server.engine.loaded == [(1, 0)] and server.engine.resets == 1  # eight requests, one load
        assert chan.acks == [0, 1]  # each version acknowledged once, when it is served
        assert all(served_versions(o) == {(1, 1)} for o in first)
        # Requests in flight on version 1 when version 2 is published: they finish on version 1,
        # the load waits for them (0 in flight at the load), the next requests get version 2.
        slow = [asyncio.create_task(server.generate([[3]], 1)) for _ in range(4)]
        await asyncio.sleep(0.01)
        assert server._inflight == 4
        chan.published = 2
        later = [asyncio.create_task(server.generate([[4]], 1)) for _ in range(4)]
        done = await asyncio.gather(*slow, *later)
        assert [served_versions(o) for o in done] == [{(1, 1)}] * 4 + [{(2, 2)}] * 4
        assert server.engine.loaded == [(1, 0), (2, 0)] and server.engine.resets == 2
        # A learner resumed from an earlier checkpoint republishes version 1: the replica goes back.
        chan.published = 1
        assert await server.weight_version() == 1 and server.engine.loaded[-1] == (1, 0)
        assert chan.acks == [0, 1, 2, 1]

    asyncio.run(run())


@pytest.mark.timeout(30)
def test_a_request_that_never_ends_fails_the_replica_instead_of_blocking_reloads():
    """A hung request would hold every later reload: past rollout.drain_timeout_s the reload
    fails and so does the health check, so Serve replaces the replica."""

    async def run() -> None:
        chan = FakeChannel()
        server = replica(chan, gen_s=3600, drain_s=0.2)
        hung = asyncio.create_task(server.generate([[1]], 1))
        await asyncio.sleep(0.05)
        chan.published = 1
        with pytest.raises(RuntimeError, match="1 requests still in flight after rollout.drain_timeout_s"):
            await server.generate([[2]], 1)
        with pytest.raises(RuntimeError, match="this replica is stuck"):
            await server.check_health()
        assert server.engine.loaded == []  # never reloaded under the hung request
        hung.cancel()

    asyncio.run(run())


@pytest.mark.timeout(30)
def test_a_load_that_breaks_midway_never_serves_under_the_old_label():
    """A transfer that fails after some tensors were loaded leaves mixed weights: the replica
    refuses every request and fails its health check (Serve replaces it) instead of answering
    with them as the old version."""

    async def run() -> None:
        chan = FakeChannel()
        server = replica(chan)
        chan.published = 1
        await server.generate([[1]], 1)
        server.engine.fail_versions = {2}
        chan.published = 2
        for _ in range(2):  # the failing request, and every one after it
            with pytest.raises(RuntimeError, match="loading weight version 2 failed midway"):
                await server.generate([[1]], 1)
        with pytest.raises(RuntimeError, match="loading weight version 2 failed midway"):
            await server.check_health()
        assert server.version == 1 and server.engine.weights == -1

    asyncio.run(run())


@pytest.mark.timeout(30)
def test_a_replica_without_a_channel_serves_the_model_as_loaded():
    async def run() -> None:
        server = replica(None)
        out = await server.generate([[1]], 3)
        assert served_versions(out) == {(0, 0)} and server.engine.loaded == [] and server.engine.resets == 0

    asyncio.run(run())


@pytest.mark.timeout(30)
def test_a_fetch_that_finds_nothing_new_leaves_the_engine_alone():
    async def run() -> None:
        chan = FakeChannel()
        server = replica(chan)
        await asyncio.gather(*[server.generate([[1]], 1) for _ in range(3)])
        assert chan.fetches == 0 and server.engine.loaded == []  # nothing published: newer_than says so

    asyncio.run(run())


@pytest.mark.timeout(30)
def test_a_load_that_hangs_fails_the_replica_at_its_deadline():
    """A transfer that never completes (an NCCL broadcast whose sender died, a stuck fetch): past
    rollout.weight_timeout_s the replica fails its health check instead of hanging its requests."""

    async def run() -> None:
        chan = FakeChannel()
        server = replica(chan, weight_s=0.2)
        server.engine.load_s = 3600
        chan.published = 1
        with pytest.raises(RuntimeError, match=r"timed out \(rollout.weight_timeout_s\)"):
            await asyncio.wait_for(server.generate([[1]], 1), 5)
        with pytest.raises(RuntimeError, match="this replica is stuck"):
            await server.check_health()
        assert server.version == 0

    asyncio.run(run())


@pytest.mark.timeout(30)
def test_a_fetch_that_fails_fails_its_request_and_the_next_one_loads():
    """Nothing reached the engine: the replica stays healthy and the next request fetches again."""

    async def run() -> None:
        chan = FakeChannel()
        server = replica(chan)
        chan.published, chan.fail_fetches = 1, 1
        with pytest.raises(RuntimeError, match="fetching the newest weight version failed: ConnectionError"):
            await server.generate([[1]], 1)
        await server.check_health()
        assert served_versions(await server.generate([[1]], 1)) == {(1, 1)} and chan.fetches == 2

    asyncio.run(run())


@pytest.mark.timeout(30)
def test_a_load_that_breaks_midway_is_redone_from_the_fallback_and_the_replica_serves_on():
    """With ``rollout.weights.fallback``, a transfer that breaks after some tensors were loaded is
    followed by the same version's load from the fallback, whole: the replica serves that version
    and stays healthy. A version only the fallback holds (the primary failed on the learner's
    side) is loaded from there alone."""

    async def run() -> None:
        primary, fallback = FakeChannel("collective"), FakeChannel("object_store")
        chan = FallbackChannel.__new__(FallbackChannel)
        chan.primary, chan.fallback, chan.timeout_s = primary, fallback, 5.0
        server = replica(chan)
        for c in (primary, fallback):
            c.board, c.published = True, 1
        server.engine.fail_versions = {"collective"}  # every collective transfer breaks midway
        assert served_versions(await server.generate([[1]], 1)) == {(1, 1)}
        await server.check_health()
        assert [c.fetches for c in (primary, fallback)] == [1, 1] and server.engine.loaded == [(1, 0)]
        assert fallback.acks == [1]
        server.engine.fail_versions = set()
        fallback.published = 2  # the primary's board still names version 1
        assert served_versions(await server.generate([[1]], 1)) == {(2, 2)}
        assert [c.fetches for c in (primary, fallback)] == [1, 2]
        for c in (primary, fallback):
            c.published = 3
        assert served_versions(await server.generate([[1]], 1)) == {(3, 3)}
        assert [c.fetches for c in (primary, fallback)] == [2, 2]  # the primary, when it holds the version

    asyncio.run(run())


@pytest.mark.timeout(30)
def test_a_replica_whose_engine_died_leaves_at_once_and_callers_retry_elsewhere():
    """A request fails and the engine is dead: the replica's process exits (Serve replaces it at
    its next probe, not after 3 failed health checks); until then it refuses with an error that
    callers retry on another replica. A request that fails on a live engine evicts nothing."""
    from raypost.serve.rollout_client import _retryable

    async def run() -> None:
        server = replica(None)
        exits: list[int] = []
        server._exit = exits.append

        async def dies(prompt: list[int], n: int) -> list[dict[str, Any]]:
            raise RuntimeError("EngineCore encountered an issue")

        server.engine.sample = dies
        with pytest.raises(RuntimeError, match="EngineCore"):
            await server.generate([[1]], 1)
        await asyncio.sleep(0.3)
        assert exits == [] and server._broken is None  # a live engine: one failed request, no eviction
        server.engine.errored = True
        with pytest.raises(RuntimeError, match="EngineCore"):
            await server.generate([[1]], 1)
        await asyncio.sleep(0.3)
        assert exits == [1]
        with pytest.raises(RuntimeError, match="vLLM engine died") as refused:
            await server.generate([[1]], 1)
        assert _retryable(refused.value)
        # No request at all: Serve's health probe finds the dead engine, and the replica leaves.
        idle = replica(None)
        idle._exit, idle.engine.errored = exits.append, True
        with pytest.raises(RuntimeError, match="engine of this replica is dead"):
            await idle.check_health()
        await asyncio.sleep(0.3)
        assert exits == [1, 1]

    asyncio.run(run())


@pytest.mark.timeout(30)
def test_a_request_past_its_timeout_fails_the_health_check_so_a_hung_engine_is_replaced():
    """An engine that hangs (no new weights to drain for: a sync learner waits for this very
    batch) fails the replica's health check once a request has run past
    ``rollout.request_timeout_s``; a slow request that ends in time leaves it healthy."""

    async def run() -> None:
        server = replica(None, gen_s=0.6, request_s=0.3)
        server.engine.errored = False
        hung = asyncio.create_task(server.generate([[1]], 1))
        await asyncio.sleep(0.1)
        await server.check_health()  # 0.1 s in: healthy
        await asyncio.sleep(0.35)
        with pytest.raises(RuntimeError, match=r"past rollout.request_timeout_s"):
            await server.check_health()
        await hung
        await server.check_health()  # it ended: nothing in flight, healthy again

    asyncio.run(run())


@pytest.mark.timeout(30)
def test_a_request_held_by_a_reload_that_hangs_counts_from_its_arrival():
    """A reload that hangs (the engine stopped under it) holds the requests that asked for the new
    version: their age counts from arrival, so the health check fails past the request timeout
    long before the weight timeout (600 s by default) would."""

    async def run() -> None:
        chan = FakeChannel()
        chan.board, chan.published = True, 1
        server = replica(chan, request_s=0.3, weight_s=30.0)
        server.engine.load_s = 0.8  # the load that hangs
        waiting = asyncio.create_task(server.generate([[1]], 1))
        await asyncio.sleep(0.45)
        assert server._inflight == 0  # still in the reload, not yet generating
        with pytest.raises(RuntimeError, match=r"past rollout.request_timeout_s"):
            await server.check_health()
        await waiting
        await server.check_health()

    asyncio.run(run())
