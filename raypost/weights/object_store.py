"""The ``object_store`` transport: learner rank 0 puts the weights into Ray's object store, one
object per bucket, and files the references with the board. A replica on any node pulls the
newest version through Ray's object transfer and writes it into one memfd, which its engine's
workers (on its node) map read-only (``raypost.weights.memfd``). No file."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch

from raypost.weights.channel import WeightChannel, register
from raypost.weights.memfd import SharedWeights
from raypost.weights.memfd import tensors as memfd_tensors
from raypost.weights.specs import Spec, in_order, nbytes


@register("object_store")
class ObjectStoreChannel(WeightChannel):
    def __init__(
        self, settings: Any, key: str, workers: int = 1, bucket_mb: int = 64, timeout_s: float = 600.0
    ) -> None:
        super().__init__(settings, key, workers, bucket_mb, timeout_s)
        self._stage = torch.empty(0, dtype=torch.uint8)  # learner: one bucket's bytes, reused for each
        self._pulling: asyncio.Lock | None = None  # made in the replica's event loop
        self._shared: Any = None  # replica: the version it pulled, in a memfd for its engine's workers

    def publish_stream(
        self, version: int, specs: Sequence[Spec], buckets: Iterable[Mapping[str, torch.Tensor]]
    ) -> None:
        stage = self.stage(version, specs)
        for bucket in buckets:
            stage.add(bucket)
        stage.record()

    def stage(self, version: int, specs: Sequence[Spec]) -> Staged:
        """Learner rank 0: ``version``, put bucket by bucket (``add``), then filed (``record``)."""
        return Staged(self, version, specs)

    def _packed(self, part: Sequence[Spec], bucket: Mapping[str, torch.Tensor]) -> Any:
        """The bucket's tensors back to back, as one numpy array in a staging buffer this channel
        reuses (Ray copies it into the object store before ``put`` returns). Ray puts one array at
        about a memcpy; an array per tensor cost 3x that, a fresh buffer's page faults more, and a
        dict of torch tensors 10x (benchmarks/weight_push.py)."""
        size = sum(nbytes(spec) for spec in part)
        if self._stage.numel() < size:
            self._stage = torch.empty(size, dtype=torch.uint8)
        offset = 0
        for _, flat in in_order(part, [bucket]):
            self._stage[offset : offset + flat.numel()] = flat
            offset += flat.numel()
        return self._stage[:size].numpy()

    async def fetch(self, have: int) -> tuple[int, dict[str, Any] | None]:
        """Pull the newest version's buckets through Ray's object store to this node, then write
        them into the memfd that the engine's workers (other processes on this node, outside
        Ray) map read-only (``raypost.weights.memfd``): one copy, no file. The source holds until
        the next fetch that finds a newer version (the replica loads one version at a time)."""
        version, boxed = await self._latest()
        if version == have or boxed is None:
            return have, None
        self._pulling = self._pulling or asyncio.Lock()
        async with self._pulling:  # concurrent requests pull each version once
            if self._shared is None or self._shared.version != version:
                specs, counts, refs = boxed[0], boxed[1], boxed[2:]
                flats = [await ref for ref in refs]  # read-only, in this node's object store
                self._shared = self._shared or SharedWeights()
                await asyncio.to_thread(self._shared.write, version, specs, split(specs, counts, flats))
        return version, {"transport": self.transport, **self._shared.source()}

    @staticmethod
    def tensors(source: Mapping[str, Any], worker: Any) -> Iterator[tuple[str, torch.Tensor]]:
        return memfd_tensors(source)

    def release(self) -> None:
        if self._shared is not None:
            self._shared.close()
            self._shared = None


class Staged:
    """One version on its way into the object store: one object per bucket, put as it arrives.
    Owned by this process (the learner's rank 0, alive for the whole run; a restarted learner
    republishes its restored version before any request; Ray 2.56 removed ray.put(_owner=)). The
    board gets [specs, counts, ref, ...]: the tensors of each bucket, in order, and its object."""

    def __init__(self, channel: ObjectStoreChannel, version: int, specs: Sequence[Spec]) -> None:
        self.channel, self.version, self.specs = channel, version, specs
        self.refs: list[Any] = []
        self.counts: list[int] = []
        self.n = 0
        self.recorded = False

    def add(self, bucket: Mapping[str, torch.Tensor]) -> None:
        import ray

        self.refs.append(ray.put(self.channel._packed(self.specs[self.n : self.n + len(bucket)], bucket)))
        self.counts.append(len(bucket))
        self.n += len(bucket)

    def record(self) -> None:
        if self.n != len(self.specs):
            raise ValueError(f"weight stream ended before its last tensor ({self.n} of {len(self.specs)})")
        self.channel._record(self.version, [[list(x) for x in self.specs], self.counts, *self.refs])
        self.recorded = True


def split(specs: Sequence[Spec], counts: Sequence[int], flats: Sequence[Any]) -> Iterator[Any]:
    """Each tensor's bytes, as views of the flat buckets that hold ``counts`` tensors each, in order."""
    n = 0
    for count, flat in zip(counts, flats):
        offset = 0
        for spec in specs[n : n + count]:
            size = nbytes(spec)
            yield flat[offset : offset + size]
            offset += size
        n += count
