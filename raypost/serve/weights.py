"""Versioned weight files for the rollout replicas, in node-local shared memory by default.

The learner writes ``v<version>.safetensors``; the version record (which file is newest) is the
run's board in Ray (``raypost.serve.channel``). Replicas ask it before serving a request and
reload when it is newer, so a new or restarted replica always serves the latest pushed
version, and a push reaches every replica without enumerating them. Old versions are pruned.
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Sequence

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
            "learner rank 0, or make rollout.weights_dir a directory that every node mounts")


Spec = tuple[str, str, list[int]]  # a tensor's name, torch dtype name ("float32", "bfloat16", ...) and shape

SAFETENSORS_DTYPES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
                      "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL"}


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
        entries[name] = {"dtype": SAFETENSORS_DTYPES[dtype], "shape": shape, "data_offsets": [offset, offset + nbytes(spec)]}
        offset += nbytes(spec)
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def write_stream(weights_dir: str | Path, version: int, specs: Sequence[Spec],
                 buckets: Iterable[Mapping[str, torch.Tensor]], keep: int = 2) -> Path:
    """Write ``v<version>.safetensors`` from ``buckets`` (dicts of tensors that arrive in ``specs``'
    order), each written as it arrives: the writer never holds more than one bucket. Atomic (a
    reader never sees half a file); prunes versions older than the last ``keep``. The caller records
    the version (the board)."""
    d = Path(weights_dir)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"v{version}.safetensors"
    tmp = path.with_suffix(".tmp")
    try:
        _write(tmp, specs, buckets)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    for old in d.glob("v*.safetensors"):
        try:
            if int(old.stem[1:]) <= version - keep:
                old.unlink(missing_ok=True)
        except ValueError:
            continue
    return path


def in_order(specs: Sequence[Spec], buckets: Iterable[Mapping[str, torch.Tensor]]) -> Iterator[tuple[int, torch.Tensor]]:
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


def _write(path: Path, specs: Sequence[Spec], buckets: Iterable[Mapping[str, torch.Tensor]]) -> None:
    """safetensors' own writer takes a whole dict; this writes its format one tensor at a time."""
    with path.open("wb") as f:
        f.write(safetensors_header(specs))
        for _, flat in in_order(specs, buckets):
            f.write(flat.numpy().data)


def publish(weights_dir: str | Path, version: int, state: Mapping[str, torch.Tensor], keep: int = 2) -> Path:
    """``write_stream`` of one dict."""
    return write_stream(weights_dir, version, specs_of(state), [state], keep)
