"""What every weight transport shares: a tensor's spec, the safetensors layout of a version, the
check that a push's stream is in order, and the learner's guard against a push that never
reaches the replicas."""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence

import torch


class WeightsNotReachedError(RuntimeError):
    """A replica served an older weight version than the learner had pushed before asking."""


def check_served(served: int, pushed: int, where: str) -> None:
    """Raise when a sample was generated with weights older than the version pushed before its
    request (``where``: the channel's ``describe()``). Replicas ask the board before every request
    (and a shm replica that cannot read the recorded file raises), so this is the learner's last
    guard against a push that does not reach them: a replica that kept serving an old version
    would leave a bounded-staleness learner waiting for fresh groups that never come."""
    if served < pushed:
        raise WeightsNotReachedError(
            f"a rollout replica served weight version {served} after the learner had pushed version {pushed} "
            f"({where}): the pushed weights do not reach it. With rollout.weights.transport=shm, "
            "rollout.weights.dir is read on the replica's own node: set rollout.weights.transport=object_store "
            "(weights go through Ray's object store to any node), run every rollout replica on the node of "
            "learner rank 0, or make rollout.weights.dir a directory that every node mounts"
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
