"""The RL core without Ray: scoring rules, and the rollout producer driven
by fakes of the rollout and reward apps (each test answers in well under a second)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from raypost.config.grpo import AlgoConfig
from raypost.rl import groups as G
from raypost.rl.controller import RolloutController, StalenessAdmission
from raypost.rl.producer import RolloutProducer
from raypost.serve.rollout_client import RolloutClient


# -- apply_scores: rewards, per-reward scores and DAPO's overlong rules -----------------------
def _groups() -> list[G.Group]:
    def sample(reason: str) -> G.Sample:
        return G.Sample([1, 2], [-0.1, -0.2], reason, "t", version=3)

    return [
        G.Group("a", [9], "qa", "1", [sample("stop"), sample("length")]),
        G.Group("b", [9], "qb", "2", [sample("length"), sample("stop")]),
    ]


@pytest.mark.parametrize(
    "overlong,rewards,masks",
    [
        ("none", [1.0, 0.5, 0.25, 0.0], [True, True, True, True]),
        ("filter", [1.0, 0.5, 0.25, 0.0], [True, False, False, True]),
        ("penalty", [1.0, 0.5 - 0.75, 0.25 - 0.75, 0.0], [True, True, True, True]),
    ],
)
def test_apply_scores_fills_rewards_in_flat_order_and_applies_overlong(overlong, rewards, masks):
    groups = _groups()
    out = {"rewards": [1.0, 0.5, 0.25, 0.0], "scores": {"accuracy": [1, 0, 0, 0], "format": [0.0, 0.5, 0.25, 0.0]}}
    G.apply_scores(groups, out, AlgoConfig(overlong=overlong, overlong_penalty=0.75))
    flat = [s for g in groups for s in g.samples]
    assert [s.reward for s in flat] == pytest.approx(rewards)
    assert [s.train_mask for s in flat] == masks
    assert [s.scores for s in flat][1] == {"accuracy": 0, "format": 0.5}
    assert groups[1].version == 3


# -- the rollout producer, driven by fakes ----------------------------------------------------
class ActorDiedError(Exception):
    """Named like Ray's: the rollout client retries errors of this name."""


class _Remote:
    def __init__(self, fn: Callable) -> None:
        self.fn = fn

    def remote(self, *args: Any) -> Any:
        return self.fn(*args)


class FakeRollout:
    """The rollout app's handle. Completion i of a prompt is [prompt[0], i]; ``fail`` maps a
    row to the errors its first requests raise; ``hang`` rows never answer, ``hang_once`` rows
    not the first time."""

    def __init__(
        self, fail: dict[int, list[Exception]] | None = None, hang: set[int] = frozenset(), hang_once: set[int] = ()
    ) -> None:
        self.calls: list[int] = []
        self.version = 0
        self.fail, self.hang, self.hang_once = fail or {}, hang, set(hang_once)
        self.generate, self.weight_version = _Remote(self._generate), _Remote(self._version)

    async def _generate(self, prompts: list[list[int]], n: int, sampling: dict) -> list[dict]:
        row = prompts[0][0]
        self.calls.append(row)
        if self.fail.get(row):
            raise self.fail[row].pop(0)
        if row in self.hang or row in self.hang_once:
            self.hang_once.discard(row)
            await asyncio.sleep(3600)
        return [
            {
                "version": self.version,
                "completions": [
                    {"token_ids": [p[0], i], "logprobs": [-1.0, -1.0], "finish_reason": "stop", "text": f"{p[0]}:{i}"}
                    for i in range(n)
                ],
            }
            for p in prompts
        ]

    async def _version(self) -> int:
        return self.version


class FakeReward:
    """The reward app's handle: sample 0 of a row scores 1, the others 0; ``flat`` rows score 0
    everywhere (no learning signal); ``broken`` makes every call raise."""

    def __init__(self, flat: set[int] = frozenset(), broken: bool = False, fail: list[Exception] | None = None) -> None:
        self.flat, self.broken, self.fail = flat, broken, fail or []
        self.calls = 0
        self.score = _Remote(self._score)

    async def _score(self, prompts: list[str], completions: list[str], answers: list[str]) -> dict:
        self.calls += 1
        if self.fail:
            raise self.fail.pop(0)
        if self.broken:
            raise ValueError("reward function 'accuracy' failed")
        rewards = []
        for text in completions:
            row, i = (int(x) for x in text.split(":"))
            rewards.append(0.0 if row in self.flat or i else 1.0)
        return {"rewards": rewards, "scores": {"accuracy": rewards}}


def rows(start: int = 0, stop: int = 1000) -> Iterator[dict]:
    for j in range(start, stop):
        yield {"id": j, "prompt_ids": [j, 7, 7], "question": f"q{j}", "answer": "1"}


def producer(
    eta: int = 0,
    batch: int = 2,
    handle: FakeRollout | None = None,
    reward: FakeReward | None = None,
    source: Iterator[dict] | None = None,
    version: int = 0,
    timeout_s: float | None = None,
    stall_s: float | None = None,
    **algo: Any,
) -> RolloutProducer:
    cfg = AlgoConfig(group_size=2, prompts_per_step=batch, **algo)
    ctl = RolloutController(StalenessAdmission(eta, batch), G.dynamic_sampling(cfg), version=version)
    client = RolloutClient(handle=handle or FakeRollout(), max_attempts=3, backoff_s=0.001, timeout_s=timeout_s)
    it = source or rows()
    reward = reward or FakeReward()
    return RolloutProducer(
        ctl, client, reward, lambda: next(it), cfg, reward_timeout_s=timeout_s, stall_s=stall_s
    ).start()


def wait_for(cond: Callable[[], bool], timeout: float = 2.0) -> None:
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, "condition not reached"
        time.sleep(0.005)


def ids(groups: list[G.Group]) -> list[int]:
    return [int(g.row_id) for g in groups]


@pytest.mark.timeout(10)
def test_producer_eta0_generates_one_batch_per_weight_version():
    handle = FakeRollout()
    p = producer(eta=0, handle=handle)
    try:
        groups, _ = p.take()
        assert ids(groups) == [0, 1] and [g.version for g in groups] == [0, 0]
        assert [s.reward for s in groups[0].samples] == [1.0, 0.0]
        time.sleep(0.1)
        assert handle.calls == [0, 1]  # nothing is generated while the learner trains version 0
        handle.version = 1
        p.advance(1)
        groups, _ = p.take()
        assert ids(groups) == [2, 3] and [g.version for g in groups] == [1, 1]
    finally:
        p.stop()


@pytest.mark.timeout(10)
def test_producer_eta1_runs_one_batch_ahead_and_no_further():
    handle = FakeRollout()
    p = producer(eta=1, handle=handle)
    try:
        wait_for(lambda: len(handle.calls) == 4)
        time.sleep(0.1)
        assert sorted(handle.calls) == [0, 1, 2, 3]  # (eta + 1) batches admitted before any push
        assert ids(p.take()[0]) == [0, 1]
        assert ids(p.take()[0]) == [2, 3]  # the batch ahead, already generated at version 0
        handle.version = 1
        p.advance(1)
        wait_for(lambda: len(handle.calls) == 6)  # one push frees one batch of capacity
    finally:
        p.stop()


@pytest.mark.timeout(10)
def test_producer_retries_replica_errors_of_rollout_and_reward():
    handle = FakeRollout(fail={1: [ActorDiedError("replica 1 died"), ActorDiedError("again")]})
    reward = FakeReward(fail=[ActorDiedError("reward replica died")])
    p = producer(handle=handle, reward=reward)
    try:
        assert ids(p.take()[0]) == [0, 1]
        assert p.client.retries == 2 and handle.calls.count(1) == 3
        assert reward.calls == 3 and p.stats()["groups_failed"] == 0  # 2 groups, one reward call retried
    finally:
        p.stop()


@pytest.mark.timeout(10)
def test_a_hung_request_times_out_and_is_retried_on_another_replica():
    handle = FakeRollout(hang_once={1})
    p = producer(handle=handle, timeout_s=0.3)
    try:
        assert ids(p.take()[0]) == [0, 1]  # row 1's first request hung: retried after 0.3 s
        assert p.client.retries == 1 and handle.calls.count(1) == 2
    finally:
        p.stop()


@pytest.mark.timeout(10)
def test_the_learner_fails_naming_the_stall_when_no_batch_comes():
    p = producer(handle=FakeRollout(hang={0, 1, 2, 3}), stall_s=0.5)  # no request deadline: only the watchdog
    try:
        t0 = time.time()
        with pytest.raises(
            TimeoutError, match=r"no rollout batch for \d+ s \(rollout.stall_timeout_s\): 2 groups in flight"
        ):
            p.take()
        assert time.time() - t0 < 3
    finally:
        p.stop()


@pytest.mark.timeout(10)
def test_failed_groups_are_dropped_and_replaced_within_their_budget_then_end_the_run():
    # A request that fails for good (not a replica error, so not retried) drops its group; the
    # next prompt takes its slot, and the run reports it.
    p = producer(handle=FakeRollout(fail={0: [KeyError("bad request")]}))
    try:
        assert ids(p.take()[0]) == [1, 2] and p.stats()["groups_failed"] == 1
    finally:
        p.stop()
    p = producer(handle=FakeRollout(fail={0: [KeyError("bad")], 1: [KeyError("bad")]}), max_failed_groups=1)
    with pytest.raises(RuntimeError, match="rollout producer failed: KeyError"):
        p.take()
    p.stop()
    p = producer(reward=FakeReward(broken=True), max_failed_groups=0)
    with pytest.raises(RuntimeError, match="reward function 'accuracy' failed"):
        p.take()
    p.stop()


@pytest.mark.timeout(10)
def test_the_failure_budget_refills_as_failures_leave_its_window():
    # One failure allowed per 4 admitted groups: rows 0 and 7 fail 7 tickets apart, and the run
    # goes on; rows 8 and 9 fail within the window and end it.
    def batches(p: RolloutProducer, handle: FakeRollout, n: int) -> list[list[int]]:
        got = []
        for version in range(1, n + 1):
            got.append(ids(p.take()[0]))
            handle.version = version
            p.advance(version)
        return got

    handle = FakeRollout(fail={r: [KeyError("bad")] for r in (0, 7)})
    p = producer(handle=handle, max_failed_groups=1, failure_window=4)
    try:
        assert batches(p, handle, 4) == [[1, 2], [3, 4], [5, 6], [8, 9]] and p.stats()["groups_failed"] == 2
    finally:
        p.stop()
    handle = FakeRollout(fail={r: [KeyError("bad")] for r in (2, 3)})
    p = producer(handle=handle, max_failed_groups=1, failure_window=4)
    with pytest.raises(RuntimeError, match="rollout producer failed: KeyError"):
        batches(p, handle, 3)
    p.stop()


@pytest.mark.timeout(10)
def test_dynamic_sampling_refills_groups_without_signal_within_its_budget():
    p = producer(reward=FakeReward(flat={0, 2}), dynamic_sampling=True)
    try:
        assert ids(p.take()[0]) == [1, 3]  # 0 and 2 had equal rewards: dropped, refilled
        assert p.stats()["groups_dropped"] == 2
    finally:
        p.stop()
    # every group flat: after max_refill_rounds x batch = 2 drops, groups are kept (advantage 0)
    p = producer(reward=FakeReward(flat=set(range(1000))), dynamic_sampling=True, max_refill_rounds=1)
    try:
        assert ids(p.take()[0]) == [2, 3]
    finally:
        p.stop()


@pytest.mark.timeout(10)
def test_producer_stops_with_requests_in_flight_and_reports_exhaustion():
    handle = FakeRollout(hang={0, 1})
    p = producer(handle=handle)
    wait_for(lambda: len(handle.calls) == 2)
    t0 = time.perf_counter()
    p.stop()
    assert time.perf_counter() - t0 < 1.0 and not p._thread.is_alive()
    handle = FakeRollout()
    p = producer(source=rows(0, 3), handle=handle)
    try:
        assert ids(p.take()[0]) == [0, 1]
        handle.version = 1  # serves the pushed version, as a replica does
        p.advance(1)
        with pytest.raises(RuntimeError, match="prompt order ran out"):
            p.take()
    finally:
        p.stop()


@pytest.mark.timeout(10)
def test_resume_continues_the_prompt_order_and_staleness_bookkeeping():
    """Three steps at eta=1 with dynamic sampling, a checkpoint (cursor = controller head,
    weight version 3), then a new producer from that cursor and version, as grpo_loop
    resumes. The trained prompts are every prompt with signal, in order, none twice or lost,
    though the first producer had generated a batch ahead that the checkpoint does not keep."""
    flat = {1, 6}
    trained: list[int] = []
    handle = FakeRollout()  # serves the newest pushed version, as a replica does
    first = producer(eta=1, handle=handle, reward=FakeReward(flat=flat), dynamic_sampling=True)
    try:
        for version in range(1, 4):
            trained += ids(first.take()[0])
            handle.version = version
            first.advance(version)
        cursor = first.ctl.head
    finally:
        first.stop()
    restored = RolloutController(StalenessAdmission(1, 2), version=3)
    assert restored.accepted == 6 and restored.capacity() == (1 + 1) * 2  # eta + 1 batches, as at a fresh v3
    resumed = producer(
        eta=1, handle=handle, reward=FakeReward(flat=flat), dynamic_sampling=True, source=rows(cursor), version=3
    )
    try:
        for version in range(4, 7):
            groups = resumed.take()[0]
            assert all(version - 1 - g.version <= 1 for g in groups)  # within eta of the learner
            trained += ids(groups)
            handle.version = version
            resumed.advance(version)
        assert resumed.ctl.dropped_stale == 0
    finally:
        resumed.stop()
    expected = [j for j in range(14) if j not in flat]
    assert trained == expected


@pytest.mark.timeout(10)
def test_a_push_that_never_reaches_the_replicas_fails_the_run_with_the_fix():
    """A replica on another node than learner rank 0 reads its own, empty /dev/shm and keeps
    serving version 0; the producer raises at the first group admitted after push 1, naming
    the fix, instead of dropping stale groups until the learner waits for ever."""
    handle = FakeRollout()
    p = producer(eta=0, handle=handle)
    try:
        assert [g.version for g in p.take()[0]] == [0, 0]
        p.advance(1)  # pushed, but handle.version stays 0: the replica never sees it
        with pytest.raises(
            RuntimeError,
            match=r"served weight version 0 after the learner had pushed version 1.*"
            r"rollout.weights.dir",
        ):
            p.take()
    finally:
        p.stop()


def test_weight_board_serves_the_last_publish_even_an_older_version():
    """A learner that resumes from an earlier checkpoint republishes an older version; replicas
    must go back to it, and only the last two publishes are kept."""
    from raypost.weights import WeightBoard

    board = WeightBoard(keep=2)
    assert board.latest() == (0, None)
    for version in (1, 2, 3):
        board.put(version, [f"ref{version}"])
    assert board.latest() == (3, ["ref3"])
    board.put(2, ["ref2-resumed"])
    assert board.latest() == (2, ["ref2-resumed"]) and len(board.published) == 2
