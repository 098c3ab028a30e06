"""The weight channel: how the learner's rank 0 hands a new weight version to the rollout replicas.

One interface, chosen by ``rollout.weight_transport``; the learner calls ``publish_stream`` (or
``publish``, for a dict) and each replica calls ``fetch`` before serving a request (it reloads
when the version is newer).

Whatever the transport, the version record lives in Ray: a small named actor (the board) holds
the newest version and where it is. The board is detached (a replica that dies does not take
the record with it) and is removed by ``close`` when the run ends. A replica that starts or
restarts late asks the board before its first request, so it serves the latest version.

* ``shm``: rank 0 writes ``v<k>.safetensors`` into ``weights_dir``, node-local shared memory by
  default (``raypost.serve.weights``), and files the file's path with the board. The fastest on
  one node; a replica on another node needs a ``weights_dir`` that every node mounts.
* ``object_store``: rank 0 puts the weights into Ray's object store, one object per bucket, and
  files the references with the board. A replica on any node pulls the newest version through
  Ray's object transfer and writes it into one memfd, which its engine's workers (on its node)
  map read-only (``raypost.serve.memfd``). No file.
* ``collective``: rank 0 keeps the newest version in (CPU) memory, the one copy it holds, and
  files its server's address with the board; a replica's engine workers receive it over a
  process group, bucket by bucket, and load it as it arrives (``raypost.serve.collective``). Any
  node, no file.

A replica turns what ``fetch`` returns (a ``source``: ``{"file": path}``, ``{"memfd": ...}`` or
``{"collective": ...}``) into weights in its engine's workers (``raypost.serve.vllm_ext``).
"""

from __future__ import annotations

import asyncio
import shutil
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from raypost.serve import weights

NAMESPACE = "raypost"


class WeightChannel(ABC):
    """Versions of the policy's weights, from the learner's rank 0 to the replicas of one run."""

    transport: str

    def __init__(self, weights_dir: str) -> None:
        self.weights_dir = weights_dir

    def publish(self, version: int, state: Mapping[str, torch.Tensor]) -> None:
        """Learner rank 0: make ``state`` the newest version."""
        self.publish_stream(version, weights.specs_of(state), [state])

    @abstractmethod
    def publish_stream(
        self, version: int, specs: Sequence[weights.Spec], buckets: Iterable[Mapping[str, torch.Tensor]]
    ) -> None:
        """Learner rank 0: make the tensors of ``specs`` the newest version. They arrive in
        ``buckets`` (dicts, in ``specs``' order), each passed on as it comes, so a learner that
        gathers its weights bucket by bucket (ZeRO-3) never holds the whole model."""

    @abstractmethod
    async def fetch(self, have: int) -> tuple[int, dict[str, Any] | None]:
        """Replica: (newest version, the source its engine workers load it from: ``{"file": a
        local safetensors file}``, ``{"memfd": ...}`` or ``{"collective": ...}``); (have, None) when
        the replica already serves the newest version or nothing was published yet."""

    async def newer_than(self, have: int) -> bool:
        """Replica: whether a version other than ``have`` was published (cheap: no transfer)."""
        return True

    def stop_serving(self) -> None:  # noqa: B027 - a no-op unless the transport serves from the learner
        """Learner rank 0, when its loop ends: stop whatever serves the weights from its process."""

    def close(self) -> None:
        """The run ended (called where the run was started): remove what the channel holds; the
        pushed weights are in the checkpoints."""
        shutil.rmtree(self.weights_dir, ignore_errors=True)

    def release(self) -> None:  # noqa: B027 - a no-op unless the transport holds replica memory
        """A replica stops: release what it holds for its engine's workers (object_store: its memfd)."""


class WeightBoard:
    """A run's version record, as a Ray actor: the last published version (also an older one,
    when a learner resumes from an earlier checkpoint) and where the last ``keep`` publishes are:
    a file path (shm) or an object ref (object_store), each inside a list, so Ray hands callers
    the ref itself."""

    def __init__(self, keep: int = 2) -> None:
        self.keep = keep
        self.published: list[tuple[int, list[Any]]] = []

    def put(self, version: int, boxed_ref: list[Any]) -> None:
        self.published = [*self.published, (version, boxed_ref)][-self.keep :]

    def latest(self) -> tuple[int, list[Any] | None]:
        return self.published[-1] if self.published else (0, None)


class BoardChannel(WeightChannel):
    """A channel whose version record is the run's board (``WeightBoard``), named after ``weights_dir``."""

    def __init__(self, weights_dir: str) -> None:
        super().__init__(weights_dir)
        self.name = f"raypost-weights:{weights_dir}"
        self._board: Any = None

    def _created_board(self) -> Any:
        """The board, created by the first publish (replicas only look it up)."""
        import ray

        if self._board is None:
            self._board = (
                ray.remote(WeightBoard)
                .options(
                    name=self.name,
                    namespace=NAMESPACE,
                    get_if_exists=True,
                    lifetime="detached",
                    num_cpus=0,
                    max_restarts=0,
                )
                .remote()
            )
        return self._board

    async def _latest(self) -> tuple[int, list[Any] | None]:
        """The board's newest (version, boxed location); (0, None) before the first publish."""
        import ray

        if self._board is None:
            try:
                self._board = ray.get_actor(self.name, namespace=NAMESPACE)
            except ValueError:  # nothing published yet
                return 0, None
        return await self._board.latest.remote()

    async def newer_than(self, have: int) -> bool:
        version, boxed = await self._latest()
        return boxed is not None and version != have

    def close(self) -> None:
        import ray

        try:
            ray.kill(ray.get_actor(self.name, namespace=NAMESPACE))
        except ValueError:  # never created, or already gone
            pass
        super().close()


class ShmChannel(BoardChannel):
    transport = "shm"

    def __init__(self, weights_dir: str) -> None:
        super().__init__(weights_dir)
        self._files: weights.VersionFiles | None = None  # learner: the version files it writes

    def publish_stream(
        self, version: int, specs: Sequence[weights.Spec], buckets: Iterable[Mapping[str, torch.Tensor]]
    ) -> None:
        import ray

        self._files = self._files or weights.VersionFiles(self.weights_dir)
        path = self._files.write(version, specs, buckets)
        ray.get(self._created_board().put.remote(version, [str(path)]))

    def stop_serving(self) -> None:  # noqa: B027 - a no-op unless the transport serves from the learner
        if self._files is not None:
            self._files.close()
            self._files = None

    async def fetch(self, have: int) -> tuple[int, dict[str, Any] | None]:
        for _ in range(2):  # a file pruned since the board was read: two newer versions were published
            version, boxed = await self._latest()
            if version == have or boxed is None:
                return have, None
            if Path(boxed[0]).is_file():
                return version, {"file": boxed[0]}
        raise weights.WeightsNotReachedError(
            f"weight version {version} is at {boxed[0]} on learner rank 0's node, "
            f"which this replica cannot read. {SHM_APART}"
        )


class ObjectStoreChannel(BoardChannel):
    transport = "object_store"

    def __init__(self, weights_dir: str) -> None:
        super().__init__(weights_dir)
        self._stage = torch.empty(0, dtype=torch.uint8)  # learner: one bucket's bytes, reused for each
        self._pulling = asyncio.Lock()
        self._shared: Any = None  # replica: the version it pulled, in a memfd for its engine's workers

    def publish_stream(
        self, version: int, specs: Sequence[weights.Spec], buckets: Iterable[Mapping[str, torch.Tensor]]
    ) -> None:
        import ray

        board = self._created_board()
        # One object per bucket, put as it arrives. Owned by this process (the learner's rank 0,
        # alive for the whole run; a restarted learner republishes its restored version before any
        # request). Ray 2.56 removed ray.put(_owner=). The board gets [specs, counts, ref, ...]:
        # the tensors of each bucket, in order, and its object.
        refs, counts, n = [], [], 0
        for bucket in buckets:
            refs.append(ray.put(self._packed(specs[n : n + len(bucket)], bucket)))
            counts.append(len(bucket))
            n += len(bucket)
        if n != len(specs):
            raise ValueError(f"weight stream ended before its last tensor ({n} of {len(specs)})")
        ray.get(board.put.remote(version, [[list(x) for x in specs], counts, *refs]))

    def _packed(self, part: Sequence[weights.Spec], bucket: Mapping[str, torch.Tensor]) -> Any:
        """The bucket's tensors back to back, as one numpy array in a staging buffer this channel
        reuses (Ray copies it into the object store before ``put`` returns). Ray puts one array at
        about a memcpy; an array per tensor cost 3x that, a fresh buffer's page faults more, and a
        dict of torch tensors 10x (benchmarks/weight_push.py)."""
        size = sum(weights.nbytes(spec) for spec in part)
        if self._stage.numel() < size:
            self._stage = torch.empty(size, dtype=torch.uint8)
        offset = 0
        for _, flat in weights.in_order(part, [bucket]):
            self._stage[offset : offset + flat.numel()] = flat
            offset += flat.numel()
        return self._stage[:size].numpy()

    async def fetch(self, have: int) -> tuple[int, dict[str, Any] | None]:
        """Pull the newest version's buckets through Ray's object store to this node, then write
        them into the memfd that the engine's workers (other processes on this node, outside
        Ray) map read-only (``raypost.serve.memfd``): one copy, no file. The source holds until
        the next fetch that finds a newer version (the replica loads one version at a time)."""
        from raypost.serve.memfd import SharedWeights

        version, boxed = await self._latest()
        if version == have or boxed is None:
            return have, None
        async with self._pulling:  # concurrent requests pull each version once
            if self._shared is None or self._shared.version != version:
                specs, counts, refs = boxed[0], boxed[1], boxed[2:]
                flats = [await ref for ref in refs]  # read-only, in this node's object store
                self._shared = self._shared or SharedWeights()
                await asyncio.to_thread(self._shared.write, version, specs, split(specs, counts, flats))
        return version, {"memfd": self._shared.source()}

    def release(self) -> None:  # noqa: B027 - a no-op unless the transport holds replica memory
        if self._shared is not None:
            self._shared.close()
            self._shared = None


def split(specs: Sequence[weights.Spec], counts: Sequence[int], flats: Sequence[Any]) -> Iterator[Any]:
    """Each tensor's bytes, as views of the flat buckets that hold ``counts`` tensors each, in order."""
    n = 0
    for count, flat in zip(counts, flats):
        offset = 0
        for spec in specs[n : n + count]:
            size = weights.nbytes(spec)
            yield flat[offset : offset + size]
            offset += size
        n += count


class CollectiveChannel(BoardChannel):
    transport = "collective"

    def __init__(self, weights_dir: str, workers: int = 1, bucket_mb: int = 64) -> None:
        super().__init__(weights_dir)
        self.workers, self.bucket_bytes = workers, bucket_mb << 20  # engine workers per replica
        self._server: Any = None

    def publish_stream(
        self, version: int, specs: Sequence[weights.Spec], buckets: Iterable[Mapping[str, torch.Tensor]]
    ) -> None:
        import ray

        from raypost.serve.collective import WeightServer

        if self._server is None:  # NCCL when this learner has a GPU: the replicas' workers then receive on theirs
            backend = "nccl" if torch.cuda.is_available() else "gloo"
            self._server = WeightServer(ray.util.get_node_ip_address(), backend, self.bucket_bytes)
        self._server.offer(version, specs, buckets)  # before the board names it: a replica never gets an older one
        ray.get(self._created_board().put.remote(version, [self._server.address]))

    async def fetch(self, have: int) -> tuple[int, dict[str, Any] | None]:
        from raypost.serve.collective import request

        version, boxed = await self._latest()
        if version == have or boxed is None:
            return have, None
        source = await asyncio.to_thread(request, boxed[0], self.workers)
        return source["version"], {"collective": source}

    def stop_serving(self) -> None:  # noqa: B027 - a no-op unless the transport serves from the learner
        if self._server is not None:
            self._server.stop()
            self._server = None


CHANNELS: dict[str, type[WeightChannel]] = {
    "shm": ShmChannel,
    "object_store": ObjectStoreChannel,
    "collective": CollectiveChannel,
}


SHM_APART = (
    "rollout.weight_transport=shm writes the weights into learner rank 0's node-local "
    "rollout.weights_dir, which a replica on another node cannot read. Set "
    "rollout.weight_transport=object_store (weights go through Ray's object store to any node), let "
    "resources.ray_resources and rollout.ray_resources share a node, or, when rollout.weights_dir is a "
    "mount every node shares, set rollout.shared_weights_dir=true"
)


def check_weight_path(rollout: Any, learner_worker: Mapping[str, float], replica: Mapping[str, float]) -> None:
    """Before anything starts: with node-local shm the replicas must be able to share learner
    rank 0's node. (A run whose replicas still land elsewhere fails at its first stale group,
    ``weights.check_served``.)"""
    if rollout.weight_transport == "shm" and not rollout.shared_weights_dir:
        from raypost.utils.cluster import check_same_node_possible

        check_same_node_possible(learner_worker, replica, SHM_APART)


def rollout_channel(rollout: Any, weights_dir: str | Path | None = None) -> WeightChannel:
    """The channel that ``rollout`` (a RolloutConfig) names, for the run's ``weights_dir``."""
    return channel(
        rollout.weight_transport,
        weights_dir or rollout.weights_dir,
        **(
            {"workers": rollout.tensor_parallel_size, "bucket_mb": rollout.weight_bucket_mb}
            if rollout.weight_transport == "collective"
            else {}
        ),
    )


def channel(transport: str, weights_dir: str | Path, **options: Any) -> WeightChannel:
    """The ``transport`` channel of the run whose pushed weights live under ``weights_dir``
    (``options``, collective: ``workers`` per replica and ``bucket_mb``)."""
    return CHANNELS[transport](str(weights_dir), **options)
