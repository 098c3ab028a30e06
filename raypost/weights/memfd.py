"""A weight version handed from a replica to its engine's workers through anonymous shared memory.

An ``object_store`` replica pulls a version's buckets through Ray's object store. Its engine's
workers are other processes on the same node (vLLM's engine core, outside Ray), so they cannot
read the pulled objects. The replica writes the tensors once into a memfd (``os.memfd_create``:
memory with no name in any filesystem, freed with its last descriptor and mapping), and each
worker maps it read-only through ``/proc/<replica pid>/fd/<fd>`` and loads the tensors from the
mapping, without a copy of its own. No file is written, and nothing crosses a socket but the
layout (JSON-able: names, dtypes, shapes, offsets).

The replica keeps one memfd, rewritten for each version, and closes it when it stops
(``SharedWeights.close``).
"""

from __future__ import annotations

import mmap
import os
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from raypost.weights.specs import Spec, nbytes

ALIGN = 64  # each tensor starts on a 64-byte boundary: any dtype's view of the mapping is aligned


def layout(specs: Sequence[Spec]) -> tuple[list[tuple[str, str, list[int], int, int]], int]:
    """(name, dtype, shape, offset, bytes) per tensor of ``specs``, in order, and the total size."""
    meta, offset = [], 0
    for name, dtype, shape in specs:
        n = nbytes((name, dtype, shape))
        meta.append((name, dtype, list(shape), offset, n))
        offset += -(-n // ALIGN) * ALIGN
    return meta, offset


class SharedWeights:
    """A replica's memfd, holding the version it pulled last, for workers on the same node.

    Each version overwrites the last in place: its pages stay allocated, so the write is a plain
    memcpy (fresh shared-memory pages cost 3-4x that). That is safe because a replica loads one
    version at a time: ``RolloutServer`` holds its lock from the fetch to the end of the load, so a
    ``source`` is read before the next version is written."""

    def __init__(self) -> None:
        self.fd = os.memfd_create("raypost-weights", os.MFD_CLOEXEC)
        self.version: int | None = None
        self.meta: list[tuple[str, str, list[int], int, int]] = []
        self.size = 0
        self._map: mmap.mmap | None = None  # the replica's writable mapping, kept across versions
        self._buf = torch.empty(0, dtype=torch.uint8)  # a view of it

    def write(self, version: int, specs: Sequence[Spec], arrays: Iterable[Any]) -> None:
        """``arrays``: each tensor's bytes (anything with the buffer protocol), in ``specs``' order."""
        self.version = None  # until the whole version is in
        meta, size = layout(specs)
        if size != self.size:
            self._resize(size)
        count = 0
        for (name, _, _, offset, n), data in zip(meta, arrays):
            view = memoryview(data).cast("B")
            if len(view) != n:
                raise ValueError(f"weight {name}: {len(view)} bytes, its spec says {n}")
            if n:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)  # a read-only source (a pulled object) is only read
                    self._buf[offset : offset + n].copy_(torch.frombuffer(view, dtype=torch.uint8))
            count += 1
        if count != len(meta):
            raise ValueError(f"weight version {version} ended before its last tensor ({count} of {len(meta)})")
        self.version, self.meta = version, meta

    def _resize(self, size: int) -> None:
        """Size the memfd and map it writable: copies into the mapping are plain memcpys (``pwrite``
        into shared memory took 2.6x one, page by page through the page cache)."""
        self._buf = torch.empty(0, dtype=torch.uint8)
        if self._map is not None:
            self._map.close()
            self._map = None
        os.ftruncate(self.fd, size)
        self.size = size
        if size:
            self._map = mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            self._buf = torch.frombuffer(self._map, dtype=torch.uint8)

    def source(self) -> dict[str, Any]:
        """What a worker's ``tensors`` takes."""
        if self.version is None:
            raise RuntimeError("no complete weight version in this replica's memfd")
        return {"version": self.version, "pid": os.getpid(), "fd": self.fd, "size": self.size, "meta": self.meta}

    def close(self) -> None:
        if self.fd >= 0:
            self._buf = torch.empty(0, dtype=torch.uint8)
            if self._map is not None:
                self._map.close()
                self._map = None
            os.close(self.fd)
            self.fd = -1


def tensors(source: dict[str, Any]) -> Iterator[tuple[str, torch.Tensor]]:
    """A worker's side: (name, tensor) for each tensor of the replica's memfd, as read-only views
    of one mapping (kept alive by the views)."""
    with open(f"/proc/{source['pid']}/fd/{source['fd']}", "rb") as f:
        mapped = mmap.mmap(f.fileno(), source["size"], access=mmap.ACCESS_READ)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "non-writable buffer": the views are only read
        buf = torch.frombuffer(mapped, dtype=torch.uint8) if source["size"] else torch.empty(0, dtype=torch.uint8)
    for name, dtype, shape, offset, n in source["meta"]:
        yield name, buf[offset : offset + n].view(getattr(torch, dtype)).reshape(shape)
