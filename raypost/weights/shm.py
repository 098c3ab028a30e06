"""The ``shm`` transport: learner rank 0 writes ``v<version>.safetensors`` into the run's folder
(``rollout.weights.dir``/<run>, node-local shared memory by default) and files its path with the
board; a replica's engine workers read the file. The fastest on one node; a replica on another
node needs a folder that every node mounts (``rollout.weights.shared``).

Old versions are pruned: the writer keeps the last two files, and rewrites the oldest in place
when no reader holds it.
"""

from __future__ import annotations

import fcntl
import logging
import mmap
import os
import shutil
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from raypost.weights.channel import WeightChannel, register
from raypost.weights.specs import Spec, WeightsNotReachedError, in_order, nbytes, safetensors_header, specs_of

SHM_APART = (
    "rollout.weights.transport=shm writes the weights into learner rank 0's node-local "
    "rollout.weights.dir, which a replica on another node cannot read. Set "
    "rollout.weights.transport=object_store (weights go through Ray's object store to any node), let "
    "resources.ray_resources and rollout.ray_resources share a node, or, when rollout.weights.dir is a "
    "mount every node shares, set rollout.weights.shared=true"
)


@register("shm")
class ShmChannel(WeightChannel):
    def __init__(
        self, settings: Any, key: str, workers: int = 1, bucket_mb: int = 64, timeout_s: float = 600.0
    ) -> None:
        super().__init__(settings, key, workers, bucket_mb, timeout_s)
        self.dir = Path(settings.dir) / key
        self._files: VersionFiles | None = None  # learner: the version files it writes

    def describe(self) -> str:
        return f"shm files in {self.dir}"

    def publish_stream(
        self, version: int, specs: Sequence[Spec], buckets: Iterable[Mapping[str, torch.Tensor]]
    ) -> None:
        self._files = self._files or VersionFiles(self.dir)
        path = self._files.write(version, specs, buckets)
        self._record(version, [str(path), this_node()])

    def stop_serving(self) -> None:
        if self._files is not None:
            self._files.close()
            self._files = None

    async def fetch(self, have: int) -> tuple[int, dict[str, Any] | None]:
        for _ in range(2):  # a file pruned since the board was read: two newer versions were published
            version, boxed = await self._latest()
            if version == have or boxed is None:
                return have, None
            if Path(boxed[0]).is_file():
                return version, {"transport": self.transport, "file": boxed[0]}
        raise WeightsNotReachedError(
            f"weight version {version} is at {boxed[0]} on learner rank 0's node, "
            f"which this replica cannot read. {SHM_APART}"
        )

    @staticmethod
    def tensors(source: Mapping[str, Any], worker: Any) -> Iterator[tuple[str, torch.Tensor]]:
        """Each tensor of the pushed file, with the file held until the last is read (the
        learner rewrites an old version's file only when no reader holds it)."""
        from safetensors import safe_open

        with reading(source["file"]) as held, safe_open(held, framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not iterable
                yield name, f.get_tensor(name)

    def close(self) -> None:
        """Remove the board and the version files, on the node that holds them (learner rank 0's,
        recorded with each publish), not the caller's."""
        node = self._files_node()
        super().close()
        if node is None or node == this_node():
            shutil.rmtree(self.dir, ignore_errors=True)
        else:
            remove_on(node, self.dir)

    def _files_node(self) -> str | None:
        """The node of the last published version's file, from the board (None: nothing published)."""
        import ray

        from raypost.weights.channel import NAMESPACE

        try:
            board = ray.get_actor(self.board_name, namespace=NAMESPACE)
            _, boxed = ray.get(board.latest.remote(), timeout=30)
        except Exception:  # noqa: BLE001 - no board (nothing published, or gone): the local folder only
            return None
        return boxed[1] if boxed and len(boxed) > 1 else None


def _remove(folder: str) -> None:
    shutil.rmtree(folder, ignore_errors=True)


def this_node() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


def remove_on(node: str, folder: Path, timeout_s: float = 60.0) -> None:
    """``rm -r folder`` on Ray node ``node``; a node that is gone took its shared memory with it."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0, max_retries=0)(_remove).options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
    )
    try:
        ray.get(task.remote(str(folder)), timeout=timeout_s)
    except Exception as err:  # noqa: BLE001 - cleanup must not fail the run that is ending
        logging.getLogger("raypost").warning("could not remove %s on node %s: %s", folder, node[:12], err)


def default_transport(rollout: Any) -> None:
    """``rollout.weights`` left unset: shm on a one-node cluster; on several, object_store, which
    reaches a replica on any node (Serve may place one where shm cannot). Set it to choose."""
    if "weights" in rollout.model_fields_set:
        return
    from raypost.utils.cluster import alive_nodes

    if alive_nodes() > 1:
        from raypost.config.weights import ObjectStoreWeights

        rollout.weights = ObjectStoreWeights()
        logging.getLogger("raypost").info(
            "rollout.weights: object_store (the cluster has several nodes; set rollout.weights.transport to choose)"
        )


def check_weight_path(rollout: Any, learner_worker: Mapping[str, float], replica: Mapping[str, float]) -> None:
    """Before anything starts: with node-local shm every replica must be able to share learner
    rank 0's node, all at once. (A run whose replicas still land elsewhere fails at its first
    stale group, ``specs.check_served``.)"""
    if rollout.weights.transport == "shm" and not rollout.weights.shared:
        from raypost.utils.cluster import check_same_node_possible

        replicas = {k: v * rollout.num_replicas for k, v in replica.items()}
        check_same_node_possible(learner_worker, replicas, SHM_APART)


class VersionFiles:
    """Learner rank 0's ``v<version>.safetensors`` files in ``folder``, the last ``keep`` of them.

    ``write`` takes a version's tensors in ``buckets`` (dicts that arrive in ``specs``' order), each
    written as it arrives: the writer never holds more than one bucket. Atomic: a reader never
    sees half a file. The caller records the version (the board).

    The oldest file to prune is rewritten in place when no reader holds it (``reading``), through
    the mapping this writer kept from writing it: its pages are allocated and mapped, so a write
    is a plain memcpy. Into a new file, page faults cost 4.7x that, and mapping and unmapping
    another 2x (benchmarks/weight_push.py). The writer maps only files that exist, and no more
    than ``keep`` of them."""

    def __init__(self, folder: str | Path, keep: int = 2) -> None:
        self.dir, self.keep = Path(folder), keep
        self._maps: dict[tuple[int, int], mmap.mmap] = {}  # (device, inode) of a version file: its mapping

    def write(self, version: int, specs: Sequence[Spec], buckets: Iterable[Mapping[str, torch.Tensor]]) -> Path:
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # the run's weights: this user's only
        path = self.dir / f"v{version}.safetensors"
        tmp = path.with_suffix(".tmp")
        old = sorted((v, p) for v, p in _versions(self.dir) if v <= version - self.keep)
        fd = _recycled(old.pop()[1], tmp) if old else None
        if fd is None:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            _fill(self._mapping(fd, specs), specs, buckets)
            os.replace(tmp, path)
            for _, stale in old:
                stale.unlink(missing_ok=True)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)  # and with it the writer's lock
            self._keep_existing()
        return path

    def publish(self, version: int, state: Mapping[str, torch.Tensor]) -> Path:
        """``write`` of one dict."""
        return self.write(version, specs_of(state), [state])

    def close(self) -> None:
        """Unmap (the files stay)."""
        for mapped in self._maps.values():
            mapped.close()
        self._maps = {}

    def _mapping(self, fd: int, specs: Sequence[Spec]) -> mmap.mmap:
        """The file's mapping, sized for ``specs``: the one kept from its last write when the size matches."""
        st = os.fstat(fd)
        size = len(safetensors_header(specs)) + sum(nbytes(spec) for spec in specs)
        mapped = self._maps.pop((st.st_dev, st.st_ino), None)
        if mapped is not None and len(mapped) != size:
            mapped.close()
            mapped = None
        if mapped is None:
            os.ftruncate(fd, size)
            self._reserve(fd, size)
            mapped = mmap.mmap(fd, size, mmap.MAP_SHARED | mmap.MAP_POPULATE, mmap.PROT_READ | mmap.PROT_WRITE)
        self._maps[(st.st_dev, st.st_ino)] = mapped
        return mapped

    def _reserve(self, fd: int, size: int) -> None:
        """Allocate the file's pages before it is mapped: writing a page that a full tmpfs cannot
        back through a mapping is a SIGBUS that kills the learner with no Python error."""
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as err:
            raise OSError(
                err.errno,
                f"rollout.weights.dir {self.dir} has no room for a {size / 2**20:.1f} MiB weight version "
                f"({os.strerror(err.errno)}): give /dev/shm more (docker --shm-size, a larger emptyDir), "
                "point rollout.weights.dir elsewhere, or set rollout.weights.transport=object_store",
            ) from None

    def _keep_existing(self) -> None:
        """Drop the mappings of files that are gone (pruned, or left to a reader): a mapping
        would keep a deleted file's memory."""
        live = set()
        for _, p in _versions(self.dir):
            try:
                st = p.stat()
            except FileNotFoundError:
                continue
            live.add((st.st_dev, st.st_ino))
        for key in set(self._maps) - live:
            self._maps.pop(key).close()


def _versions(d: Path) -> Iterator[tuple[int, Path]]:
    for p in d.glob("v*.safetensors"):
        if p.stem[1:].isdigit():
            yield int(p.stem[1:]), p


def _recycled(old: Path, tmp: Path) -> int | None:
    """``old`` renamed to ``tmp`` and opened under an exclusive lock, to be rewritten; None (and
    ``old`` unlinked: a reader keeps its own copy) when a reader holds it."""
    try:
        os.replace(old, tmp)  # a reader that opens ``old`` from now on finds nothing
        fd = os.open(tmp, os.O_RDWR)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except BlockingIOError:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        return None


@contextmanager
def reading(path: str | Path) -> Iterator[str]:
    """Hold a version file for as long as it is read, and give the path to read it by (its open
    descriptor's, which reaches the same file after a newer version unlinks it): the learner
    rewrites an old version's file in place only when no reader holds it (``VersionFiles``).
    Raises FileNotFoundError when the file is gone or was taken for a newer version before it was
    held (the replica's next request fetches the newest)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        held = os.fstat(fd)
        try:
            named = os.stat(path)
            same = (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino)
        except FileNotFoundError:
            same = False
        if not same:
            raise FileNotFoundError(f"{path} was replaced by a newer weight version before it was read")
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


def _fill(mapped: mmap.mmap, specs: Sequence[Spec], buckets: Iterable[Mapping[str, torch.Tensor]]) -> None:
    """safetensors' own writer takes a whole dict; this writes its format one tensor at a time,
    into a mapping of the file (a copy per tensor, no write call per page)."""
    header = safetensors_header(specs)
    buf = torch.frombuffer(mapped, dtype=torch.uint8)
    buf[: len(header)] = torch.frombuffer(bytearray(header), dtype=torch.uint8)
    offset = len(header)
    for _, flat in in_order(specs, buckets):
        buf[offset : offset + flat.numel()] = flat
        offset += flat.numel()
    mapped.flush()  # written back before the rename names it (a no-op in shared memory; a mount's page cache)
