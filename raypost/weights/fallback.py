"""A transport with a fallback: ``rollout.weights.fallback: object_store`` under ``collective`` (or
``shm``). Every version goes out on both: the learner's rank 0 puts each bucket into the fallback
(Ray's object store) as the primary consumes it, and files the version with the fallback's board
before the primary's, so the fallback always holds the newest version. A replica loads each version
through the primary; when that fails or times out (a weight server it can't reach, a process group
that never forms, a transfer that breaks midway) it loads the same version from the fallback, over
whatever the primary left half-loaded, and serves on. Only a failure of both marks it broken.

A primary that fails on the learner's side (its server can't start, its board can't record) costs
a warning: the rest of the stream goes to the fallback, and the replicas find the version there
(the primary's board then names an older one). The price is one more copy of each version in the
object store (the last two versions are kept) and a memcpy per bucket on rank 0.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
from pydantic import TypeAdapter

from raypost.config.weights import WeightTransport
from raypost.weights.channel import TRANSPORTS, WeightChannel
from raypost.weights.specs import Spec

log = logging.getLogger("raypost")


class FallbackChannel(WeightChannel):
    """``primary`` (``settings.transport``) first, ``fallback`` (``settings.fallback``) when it fails.
    The fallback's board (key ``<key>-fallback``) is the record of the newest version and of the
    replicas' acknowledgements."""

    def __init__(
        self, settings: Any, key: str, workers: int = 1, bucket_mb: int = 64, timeout_s: float = 600.0
    ) -> None:
        super().__init__(settings, key, workers, bucket_mb, timeout_s)
        self.transport = settings.transport
        self.primary = TRANSPORTS[settings.transport](settings, key, workers, bucket_mb, timeout_s)
        section = TypeAdapter(WeightTransport).validate_python({"transport": settings.fallback})
        self.fallback = TRANSPORTS[settings.fallback](section, f"{key}-fallback", workers, bucket_mb, timeout_s)
        self.failures: list[str] = []  # learner: why the primary failed, one line per publish

    def describe(self) -> str:
        return f"weight transport {self.primary.transport} (fallback {self.fallback.transport}), run {self.key}"

    @property
    def reload_deadline_s(self) -> float:
        """The primary's attempt (``timeout_s``), then the fallback's (``2 * timeout_s``: its load
        may queue in the engine behind the primary's abandoned transfer, which ends at ``timeout_s``)."""
        return 3 * self.timeout_s

    def publish_stream(
        self, version: int, specs: Sequence[Spec], buckets: Iterable[Mapping[str, torch.Tensor]]
    ) -> None:
        stage = self.fallback.stage(version, specs)
        stream = iter(buckets)

        def teed() -> Iterator[Mapping[str, torch.Tensor]]:
            for bucket in stream:
                stage.add(bucket)
                yield bucket
            stage.record()  # before the primary files the version: the fallback is never behind it

        try:
            self.primary.publish_stream(version, specs, teed())
        except Exception as err:  # noqa: BLE001 - the fallback carries this version
            self.failures = [*self.failures[-99:], f"version {version}: {type(err).__name__}: {err}"]
            log.warning(
                "%s failed for version %d (%s); it goes out on the fallback", self.primary.describe(), version, err
            )
            for bucket in stream:  # the rest of the stream (every rank's gathers must finish)
                stage.add(bucket)
            if not stage.recorded:
                stage.record()

    async def newer_than(self, have: int) -> bool:
        return await self.fallback.newer_than(have)

    async def fetch(self, have: int) -> tuple[int, dict[str, Any] | None]:
        return await self.fallback.fetch(have)

    @staticmethod
    def tensors(source: Mapping[str, Any], worker: Any) -> Iterator[tuple[str, torch.Tensor]]:
        return TRANSPORTS[source["transport"]].tensors(source, worker)

    async def reload(self, have: int, load: Callable[[int, dict[str, Any]], Awaitable[None]]) -> int | None:
        """Load the fallback board's newest version through the primary when the primary's board
        names the same version, else (or when the primary fails) from the fallback."""
        target, _ = await self.fallback._latest()
        if target == have:
            return None
        if (await self.primary._latest())[0] == target:
            try:
                return await asyncio.wait_for(self.primary.reload(have, load), self.timeout_s)
            except Exception as err:  # noqa: BLE001 - the fallback holds the same version
                log.warning(
                    "loading weight version %d over %s failed (%s: %s); loading it from the fallback",
                    target,
                    self.primary.transport,
                    type(err).__name__,
                    err,
                )
        return await asyncio.wait_for(self.fallback.reload(have, load), 2 * self.timeout_s)

    async def ack(self, replica: str, version: int) -> bool:
        return await self.fallback.ack(replica, version)

    def served_versions(self, max_age_s: float = 600.0) -> dict[str, int]:
        return self.fallback.served_versions(max_age_s)

    def stop_serving(self) -> None:
        self.primary.stop_serving()
        self.fallback.stop_serving()

    def release(self) -> None:
        self.primary.release()
        self.fallback.release()

    def close(self) -> None:
        self.primary.close()
        self.fallback.close()
