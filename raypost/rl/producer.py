"""The rollout producer: keeps the Serve rollout replicas busy and the controller fed.

It runs on the learner's rank 0 in a thread with its own event loop. Whenever the
controller has capacity it admits the next prompt, asks the rollout app for G completions
(one request per group, so Serve spreads groups over replicas and a replica added by
scaling gets work at once), scores them on the reward app and files the group. The learner
calls ``take`` for the next batch and ``advance`` after each weight push.

Weight pushes reach a replica between requests: it drains its in-flight requests, reloads and
serves the rest with the new version (raypost.serve.rollout_app). Generation is not
interrupted mid-request; every sample carries the version it was generated with.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from raypost.config.grpo import AlgoConfig
from raypost.rl import groups as G
from raypost.rl.controller import RolloutController
from raypost.weights import WeightsNotReachedError, check_served

log = logging.getLogger("raypost.producer")


class RolloutProducer:
    """``reward_timeout_s`` bounds each score request (then retried); ``stall_s`` bounds how long
    ``take`` waits for a batch before the run fails naming what is stuck (None: unbounded);
    ``rollout(row)`` makes a row's group (None: G single-turn completions in one request;
    multi-turn: ``raypost.agents.AgentRollout.group``)."""

    def __init__(
        self,
        controller: RolloutController,
        client: Any,
        reward: Any,
        next_row: Callable[[], dict],
        algo: AlgoConfig,
        reward_timeout_s: float | None = None,
        stall_s: float | None = None,
        rollout: Callable[[dict], Awaitable[G.Group]] | None = None,
    ) -> None:
        self.rollout = rollout or self._single_turn
        self.ctl, self.client, self.reward, self.next_row, self.algo = controller, client, reward, next_row, algo
        self.reward_timeout_s, self.stall_s = reward_timeout_s, stall_s
        self.cond = threading.Condition()
        self.error: BaseException | None = None
        self.exhausted = self.stopping = False
        self.capacity_wait_s = 0.0
        self.started = time.perf_counter()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="raypost-producer", daemon=True)

    # -- learner side ---------------------------------------------------------------------
    def start(self) -> RolloutProducer:
        self._thread.start()
        return self

    def take(self) -> tuple[list[G.Group], float]:
        """Block until the next batch is complete; returns (groups, seconds waited)."""
        t0 = time.perf_counter()
        with self.cond:
            while not self.ctl.ready():
                if self.stall_s is not None and time.perf_counter() - t0 > self.stall_s:
                    raise TimeoutError(self._stalled(time.perf_counter() - t0))
                if self.error is not None:
                    raise RuntimeError(f"rollout producer failed: {self.error!r}") from self.error
                if self.exhausted and not self.ctl.running:
                    raise RuntimeError(
                        "the prompt order ran out before the last step; raise data size or lower algo.steps"
                    )
                self.cond.wait(timeout=1.0)
            groups = self.ctl.take()
        self._notify()
        return groups, time.perf_counter() - t0

    def _stalled(self, waited: float) -> str:
        app = getattr(self.client, "app_name", "the rollout app")
        return (
            f"no rollout batch for {waited:.0f} s (rollout.stall_timeout_s): {len(self.ctl.running)} groups in "
            f"flight on {app}, {sum(g is not None for g in self.ctl.done.values())} done. A replica or the reward "
            "app is stuck or gone: see `serve status` and the run's logs.txt"
        )

    def advance(self, version: int) -> None:
        with self.cond:
            self.ctl.advance(version)
        self._notify()

    def stats(self) -> dict[str, float]:
        with self.cond:
            return {
                "in_flight": len(self.ctl.running),
                "buffered": sum(g is not None for g in self.ctl.done.values()),
                "dropped_stale": self.ctl.dropped_stale,
                "groups_dropped": self.ctl.dropped_filtered,
                "groups_failed": self.ctl.failed,
                "producer_wait_frac": self.capacity_wait_s / max(time.perf_counter() - self.started, 1e-9),
            }

    def stop(self) -> None:
        self.stopping = True
        self._notify()
        if self._thread.ident is not None:  # started (a run may fail before it starts the producer)
            self._thread.join(timeout=60)

    def _notify(self) -> None:
        if self._loop is not None and self._wake is not None:
            try:
                self._loop.call_soon_threadsafe(self._wake.set)
            except RuntimeError:  # the producer's loop has ended (stopped, or failed: take() raises that)
                pass

    # -- producer thread ------------------------------------------------------------------
    async def _main(self) -> None:
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        tasks: set[asyncio.Task] = set()
        try:
            while not self.stopping and not self.exhausted and self.error is None:
                ticket = await self._admit()
                if ticket is None:
                    continue
                try:
                    row = self.next_row()
                except StopIteration:
                    with self.cond:
                        self.exhausted = True
                        self.ctl.withdraw(ticket)
                        self.cond.notify_all()
                    break
                task = asyncio.create_task(self._one(ticket, row))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            while tasks and not self.stopping and self.error is None:
                self._wake.clear()
                await self._wake_or_timeout()
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _wake_or_timeout(self) -> None:
        try:
            await asyncio.wait_for(self._wake.wait(), timeout=0.5)
        except asyncio.TimeoutError:
            pass

    async def _admit(self) -> int | None:
        """A ticket once the controller has capacity (time spent waiting is counted)."""
        t0 = time.perf_counter()
        while not self.stopping:
            self._wake.clear()  # before the check: a notify after it wakes the wait below
            with self.cond:
                ticket = self.ctl.admit()
            if ticket is not None:
                self.capacity_wait_s += time.perf_counter() - t0
                return ticket
            await self._wake_or_timeout()
        return None

    async def _single_turn(self, row: dict) -> G.Group:
        out = (await self.client.agenerate([row["prompt_ids"]], self.algo.group_size, G.sampling(self.algo)))[0]
        return G.to_group(row, out)

    async def _one(self, ticket: int, row: dict) -> None:
        try:
            t0 = time.perf_counter()
            with self.cond:
                pushed = self.ctl.running.get(ticket, 0)  # the learner's version when this group was admitted
            group, t1 = await self.rollout(row), time.perf_counter()
            check_served(group.version, pushed, self.client.channel.describe() if self.client.channel else "no channel")
            args = G.reward_args([group])
            scores = await self.client.retried(lambda: self.reward.score.remote(*args), "reward", self.reward_timeout_s)
            G.apply_scores([group], scores, self.algo)
            group.timing = {"gen_start": t0, "gen_end": t1, "reward_s": time.perf_counter() - t1}
            with self.cond:
                self.ctl.complete(ticket, group)
                self.cond.notify_all()
            self._wake.set()  # a dropped group frees capacity: admit its refill now, not at the next poll
        except asyncio.CancelledError:
            raise
        except BaseException as err:  # noqa: BLE001 - dropped within the budget, else surfaced to the learner by take()
            with self.cond:
                fatal = not isinstance(err, Exception) or isinstance(err, WeightsNotReachedError)
                if fatal or self.ctl.failed_within(self.algo.failure_window) >= self.algo.max_failed_groups:
                    log.error("rollout group %d failed: %r", ticket, err)
                    self.error = err
                else:
                    self.ctl.fail(ticket)
                    log.warning(
                        "rollout group %d failed and is dropped (%d of algo.max_failed_groups=%d in the last %d): %r",
                        ticket,
                        self.ctl.failed_within(self.algo.failure_window),
                        self.algo.max_failed_groups,
                        self.algo.failure_window,
                        err,
                    )
                self.cond.notify_all()
            self._notify()
