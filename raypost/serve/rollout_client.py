"""Caller side of the rollout app: spread prompts over replicas, retry what a dying
replica dropped, and push weights with versions."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import torch

from raypost.weights import WeightChannel

log = logging.getLogger("raypost.rollout")
T = TypeVar("T")

# Errors that mean "this request's replica is gone or unreachable", worth a retry elsewhere.
RETRYABLE = (
    "RayActorError",
    "ActorDiedError",
    "ActorUnavailableError",
    "RayServeException",
    "DeploymentUnavailableError",
    "BackPressureError",
    "WorkerCrashedError",
    "OwnerDiedError",
    "EngineDeadError",
    "TimeoutError",  # a request past its deadline: its replica may be hung; another may answer
)  # a dead vLLM engine fails its replica's health check; Serve replaces it


def _retryable(err: BaseException) -> bool:
    return any(t.__name__ in RETRYABLE for t in type(err).__mro__)


async def with_retries(
    call: Callable[[], Awaitable[T]],
    what: str,
    max_attempts: int,
    backoff_s: float,
    on_retry: Callable[[], None] | None = None,
    timeout_s: float | None = None,
) -> T:
    """``await call()``, each try bounded by ``timeout_s`` (None: unbounded); a replica error
    (``RETRYABLE``, a timeout included) is retried up to ``max_attempts`` tries in all, after
    ``backoff_s`` doubling per attempt (capped at 10x). Other errors raise at once."""
    for attempt in range(1, max_attempts + 1):
        try:
            return await asyncio.wait_for(call(), timeout_s)
        except Exception as err:  # noqa: BLE001 - classified below
            if not _retryable(err) or attempt == max_attempts:
                raise
            if on_retry is not None:
                on_retry()
            log.warning(
                "%s request failed (%s); retry %d/%d on another replica",
                what,
                type(err).__name__,
                attempt,
                max_attempts - 1,
            )
            await asyncio.sleep(min(10 * backoff_s, backoff_s * 2**attempt))
    raise AssertionError("unreachable")


class RolloutClient:
    """Generate on the ``app_name`` Serve app (or on ``handle``, any object with the app's
    ``generate.remote`` and ``weight_version.remote``); ``chunk`` prompts per request; weights are
    pushed through ``channel``, the one the app was deployed with (None: no pushes). A
    request that fails with a replica error is retried up to ``max_attempts`` times, after
    ``backoff_s`` doubling per attempt (capped at 10x); each try is bounded by ``timeout_s``."""

    def __init__(
        self,
        app_name: str = "rollout",
        channel: WeightChannel | None = None,
        max_attempts: int = 4,
        chunk: int = 1,
        handle: Any = None,
        backoff_s: float = 0.2,
        timeout_s: float | None = None,
    ) -> None:
        if handle is None:
            from ray import serve

            handle = serve.get_app_handle(app_name)
        self.handle, self.app_name = handle, app_name
        self.channel = channel
        self.max_attempts, self.chunk, self.backoff_s, self.timeout_s = max_attempts, chunk, backoff_s, timeout_s
        self.retries = 0

    async def _one(self, prompts: list[list[int]], n: int, sampling: dict) -> list[dict]:
        return await with_retries(
            lambda: self.handle.generate.remote(prompts, n, sampling),
            "rollout",
            self.max_attempts,
            self.backoff_s,
            self._count_retry,
            self.timeout_s,
        )

    def _count_retry(self) -> None:
        self.retries += 1

    async def agenerate(
        self, prompt_ids: Sequence[Sequence[int]], n: int, sampling: Mapping[str, Any], chunk: int | None = None
    ) -> list[dict]:
        """n completions per prompt, in prompt order; ``chunk`` prompts a request (default the
        client's); requests run concurrently."""
        size = max(1, chunk or self.chunk)
        chunks = [[list(p) for p in prompt_ids[i : i + size]] for i in range(0, len(prompt_ids), size)]
        parts = await asyncio.gather(*[self._one(c, n, dict(sampling)) for c in chunks])
        return [g for part in parts for g in part]

    def generate(self, prompt_ids: Sequence[Sequence[int]], n: int, sampling: Mapping[str, Any]) -> list[dict]:
        return asyncio.run(self.agenerate(prompt_ids, n, sampling))

    def update_weights(self, version: int, state: Mapping[str, torch.Tensor]) -> float:
        """Publish ``state`` as ``version``; every replica loads it before its next request.
        Returns the seconds spent writing."""
        if self.channel is None:
            raise ValueError("this RolloutClient was made without a weight channel: pass the app's channel")
        t0 = time.perf_counter()
        self.channel.publish(version, state)
        return time.perf_counter() - t0

    async def await_version(self, version: int, timeout_s: float = 120.0) -> None:
        """Wait until a replica reports ``version`` (it reloads on this call if needed)."""
        deadline = time.time() + timeout_s
        while await self.handle.weight_version.remote() < version:
            if time.time() > deadline:
                raise TimeoutError(f"no replica reached weight version {version} in {timeout_s}s")
            await asyncio.sleep(0.05)
