"""Versioned weight files for the rollout replicas, in node-local shared memory by default.

The learner writes ``v<version>.safetensors``; the version record (which file is newest) is the
run's board in Ray (``raypost.serve.channel``). Replicas ask it before serving a request and
reload when it is newer, so a new or restarted replica always serves the latest pushed
version, and a push reaches every replica without enumerating them. Old versions are pruned.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

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


def publish(weights_dir: str | Path, version: int, state: Mapping[str, torch.Tensor], keep: int = 2) -> Path:
    """Write ``state`` as ``v<version>.safetensors`` (atomically: a reader never sees half a file)
    and prune versions older than the last ``keep``; the caller records the version (the board)."""
    from safetensors.torch import save_file

    d = Path(weights_dir)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"v{version}.safetensors"
    tmp = path.with_suffix(".tmp")
    save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, str(tmp))
    os.replace(tmp, path)
    for old in d.glob("v*.safetensors"):
        try:
            if int(old.stem[1:]) <= version - keep:
                old.unlink(missing_ok=True)
        except ValueError:
            continue
    return path
