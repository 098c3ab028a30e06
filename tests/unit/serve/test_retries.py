"""``with_retries``: a replica error is retried for max_attempts tries and then on within the retry
window from the first failure (a dead replica's replacement by Serve fits in it); an error that is
not a replica's raises at once; a fault that outlasts the window raises once the window is spent."""

from __future__ import annotations

import asyncio
import time

import pytest

from raypost.config.serve import RolloutConfig
from raypost.serve.rollout_client import RolloutClient, with_retries


class ActorDiedError(Exception):  # matched by name, as Ray's is
    pass


def failing(for_s: float, err: type[Exception] = ActorDiedError):
    """A call that raises ``err`` until ``for_s`` seconds after its first try, then answers."""
    calls: list[float] = []

    async def call() -> str:
        calls.append(time.monotonic())
        if calls[-1] - calls[0] < for_s:
            raise err("replica gone")
        return "ok"

    return call, calls


def test_a_fault_shorter_than_the_window_is_ridden_out_past_max_attempts():
    call, calls = failing(0.3)
    assert asyncio.run(with_retries(call, "rollout", 2, 0.01, window_s=2.0)) == "ok"
    assert len(calls) > 2 and calls[-1] - calls[0] >= 0.3


def test_without_a_window_max_attempts_tries_are_all():
    call, calls = failing(10.0)
    with pytest.raises(ActorDiedError):
        asyncio.run(with_retries(call, "rollout", 3, 0.001))
    assert len(calls) == 3


def test_a_fault_that_outlasts_the_window_raises_when_it_is_spent():
    call, calls = failing(60.0)
    t0 = time.monotonic()
    with pytest.raises(ActorDiedError):
        asyncio.run(with_retries(call, "rollout", 2, 0.01, window_s=0.4))
    spent = time.monotonic() - t0
    assert 0.3 <= spent < 1.0 and len(calls) > 2  # backoff 0.02 s doubling, capped at 0.1 s


def test_an_error_that_is_not_a_replicas_raises_at_once():
    call, calls = failing(60.0, ValueError)
    with pytest.raises(ValueError):
        asyncio.run(with_retries(call, "reward", 4, 0.001, window_s=60.0))
    assert len(calls) == 1


def test_the_client_takes_the_rollout_sections_settings():
    cfg = RolloutConfig(max_attempts=5, retry_window_s=42.0, request_timeout_s=7.0)
    client = RolloutClient.of("app", None, cfg, chunk=3, handle=object())
    assert (client.max_attempts, client.retry_window_s, client.timeout_s, client.chunk) == (5, 42.0, 7.0, 3)
    assert RolloutConfig().retry_window_s == 300.0  # covers Serve's replacement of a replica
