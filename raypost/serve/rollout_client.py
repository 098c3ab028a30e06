"""Caller side of the rollout app: spread prompts over replicas, retry what a dying
replica dropped, and push weights with versions."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from raypost.weights import WeightChannel

if TYPE_CHECKING:
    from raypost.config.serve import RolloutConfig

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
    "ReplicaBrokenError",  # raypost's replica refusing while Serve replaces it
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
    window_s: float = 0.0,
) -> T:
    """``await call()``, each try bounded by ``timeout_s`` (None: unbounded). A replica error
    (``RETRYABLE``, a timeout included) is retried: ``max_attempts`` tries at least, and on for
    ``window_s`` seconds from the first failure (``rollout.retry_window_s``: Serve's replacement of
    a dead replica fits in it, so a replica death costs no request), after ``backoff_s`` doubling
    per retry, capped at 10x. Other errors raise at once."""
    first_failure: float | None = None
    attempt = 0
    while True:
        attempt += 1
        try:
            return await asyncio.wait_for(call(), timeout_s)
        except Exception as err:  # noqa: BLE001 - classified below
            now = time.monotonic()
            first_failure = now if first_failure is None else first_failure
            pause = min(10 * backoff_s, backoff_s * 2**attempt)
            in_window = now - first_failure + pause <= window_s
            if not _retryable(err) or (attempt >= max_attempts and not in_window):
                raise
            if on_retry is not None:
                on_retry()
            if attempt < max_attempts or attempt % 10 == 0:  # in the window: one line every 10 tries
                log.warning(
                    "%s request failed (%s); retry %d on another replica (%d tries, or %.0f s from the first "
                    "failure: rollout.max_attempts, rollout.retry_window_s)",
                    what,
                    type(err).__name__,
                    attempt,
                    max_attempts,
                    window_s,
                )
            await asyncio.sleep(pause)


class RolloutClient:
    """Generate on the ``app_name`` Serve app (or on ``handle``, any object with the app's
    ``generate.remote`` and ``weight_version.remote``); ``chunk`` prompts per request; weights are
    pushed through ``channel``, the one the app was deployed with (None: no pushes). A
    request that fails with a replica error is retried (``with_retries``: ``max_attempts`` tries,
    and on for ``retry_window_s`` from its first failure); each try is bounded by ``timeout_s``."""

    def __init__(
        self,
        app_name: str = "rollout",
        channel: WeightChannel | None = None,
        max_attempts: int = 4,
        chunk: int = 1,
        handle: Any = None,
        backoff_s: float = 0.2,
        timeout_s: float | None = None,
        retry_window_s: float = 0.0,
    ) -> None:
        if handle is None:
            from ray import serve

            handle = serve.get_app_handle(app_name)
        self.handle, self.app_name = handle, app_name
        self.channel = channel
        self.max_attempts, self.chunk, self.backoff_s, self.timeout_s = max_attempts, chunk, backoff_s, timeout_s
        self.retry_window_s = retry_window_s
        self.retries = 0

    @classmethod
    def of(
        cls, app_name: str, channel: WeightChannel | None, cfg: RolloutConfig, chunk: int = 1, handle: Any = None
    ) -> RolloutClient:
        """A client with the rollout section's retry and timeout settings."""
        return cls(
            app_name,
            channel,
            cfg.max_attempts,
            chunk=chunk,
            handle=handle,
            timeout_s=cfg.request_timeout_s,
            retry_window_s=cfg.retry_window_s,
        )

    async def retried(
        self,
        call: Callable[[], Awaitable[T]],
        what: str,
        timeout_s: float | None,
        on_retry: Callable[[], None] | None = None,
    ) -> T:
        """``call`` under this client's retry settings (also the reward app's calls beside the rollouts)."""
        return await with_retries(
            call, what, self.max_attempts, self.backoff_s, on_retry, timeout_s, self.retry_window_s
        )

    async def _one(self, prompts: list[list[int]], n: int, sampling: dict) -> list[dict]:
        return await self.retried(
            lambda: self.handle.generate.remote(prompts, n, sampling), "rollout", self.timeout_s, self._count_retry
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
