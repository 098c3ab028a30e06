"""Versioned weight files for the rollout replicas, in node-local shared memory by default.

The learner writes ``v<version>.safetensors``; the version record (which file is newest) is the
run's board in Ray (``raypost.serve.channel``). Replicas ask it before serving a request and
reload when it is newer, so a new or restarted replica always serves the latest pushed
version, and a push reaches every replica without enumerating them. Old versions are pruned.
"""

from __future__ import annotations

import fcntl
import json
import math
import mmap
import os
import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch


class WeightsNotReachedError(RuntimeError):
    """A replica served an older weight version than the learner had pushed before asking."""


def check_served(served: int, pushed: int, weights_dir: str | Path) -> None:
    """Raise when a sample was generated with weights older than the version pushed before its
    request. Replicas ask the board before every request (and a shm replica that cannot read the
    recorded file raises), so this is the learner's last guard against a push that does not reach
    them: a replica that kept serving an old version would leave a bounded-staleness learner
    waiting for fresh groups that never come."""
    if served < pushed:
        raise WeightsNotReachedError(
            f"a rollout replica served weight version {served} after the learner had pushed version {pushed} "
            f"to {weights_dir}: the pushed weights do not reach it. With rollout.weight_transport=shm, "
            "rollout.weights_dir is read on the replica's own node: set rollout.weight_transport=object_store "
            "(weights go through Ray's object store to any node), run every rollout replica on the node of "
            "learner rank 0, or make rollout.weights_dir a directory that every node mounts"
        )


Spec = tuple[str, str, list[int]]  # a tensor's name, torch dtype name ("float32", "bfloat16", ...) and shape

SAFETENSORS_DTYPES = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint8": "U8",
    "bool": "BOOL",
}


def specs_of(state: Mapping[str, torch.Tensor]) -> list[Spec]:
    """(name, dtype, shape) of each tensor of ``state``, in its order."""
    return [(k, str(v.dtype).removeprefix("torch."), list(v.shape)) for k, v in state.items()]


def nbytes(spec: Spec) -> int:
    _, dtype, shape = spec
    return math.prod(shape) * getattr(torch, dtype).itemsize


def safetensors_header(specs: Sequence[Spec]) -> bytes:
    """The safetensors header of a file holding ``specs``' tensors back to back, in order: its
    8-byte little-endian length, then the JSON (padded with spaces to 8 bytes, as safetensors pads)."""
    entries, offset = {}, 0
    for spec in specs:
        name, dtype, shape = spec
        entries[name] = {
            "dtype": SAFETENSORS_DTYPES[dtype],
            "shape": shape,
            "data_offsets": [offset, offset + nbytes(spec)],
        }
        offset += nbytes(spec)
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


class VersionFiles:
    """Learner rank 0's ``v<version>.safetensors`` files in ``weights_dir``, the last ``keep`` of them.

    ``write`` takes a version's tensors in ``buckets`` (dicts that arrive in ``specs``' order), each
    written as it arrives: the writer never holds more than one bucket. Atomic: a reader never
    sees half a file. The caller records the version (the board).

    The oldest file to prune is rewritten in place when no reader holds it (``reading``), through
    the mapping this writer kept from writing it: its pages are allocated and mapped, so a write
    is a plain memcpy. Into a new file, page faults cost 4.7x that, and mapping and unmapping
    another 2x (benchmarks/weight_push.py). The writer maps only files that exist, and no more
    than ``keep`` of them."""

    def __init__(self, weights_dir: str | Path, keep: int = 2) -> None:
        self.dir, self.keep = Path(weights_dir), keep
        self._maps: dict[tuple[int, int], mmap.mmap] = {}  # (device, inode) of a version file: its mapping

    def write(self, version: int, specs: Sequence[Spec], buckets: Iterable[Mapping[str, torch.Tensor]]) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / f"v{version}.safetensors"
        tmp = path.with_suffix(".tmp")
        old = sorted((v, p) for v, p in _versions(self.dir) if v <= version - self.keep)
        fd = _recycled(old.pop()[1], tmp) if old else None
        if fd is None:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
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
            mapped = mmap.mmap(fd, size, mmap.MAP_SHARED | mmap.MAP_POPULATE, mmap.PROT_READ | mmap.PROT_WRITE)
        self._maps[(st.st_dev, st.st_ino)] = mapped
        return mapped

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


def in_order(
    specs: Sequence[Spec], buckets: Iterable[Mapping[str, torch.Tensor]]
) -> Iterator[tuple[int, torch.Tensor]]:
    """(index in ``specs``, tensor as flat bytes) for each tensor of ``buckets``, checked against
    ``specs`` (name, dtype and shape, in order, none missing): a push's receivers lay the bytes
    out by ``specs`` alone."""
    n = 0
    for bucket in buckets:
        for name, tensor in bucket.items():
            got = (name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape))
            want = specs[n] if n < len(specs) else None
            if want is None or (want[0], want[1], list(want[2])) != got:
                raise ValueError(f"weight stream out of order: got {got}, expected {want}")
            yield n, tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
            n += 1
    if n != len(specs):
        raise ValueError(f"weight stream ended before its last tensor ({n} of {len(specs)})")


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
