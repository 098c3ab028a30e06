"""Versioned weights for the rollout replicas, through node-local shared memory.

The learner writes ``v<version>.safetensors`` and then, atomically, ``LATEST`` (JSON:
version + file). Replicas read ``LATEST`` before serving a request and reload when it
is newer, so a new or restarted replica always serves the latest pushed version, and a
push reaches every replica without enumerating them. Old versions are pruned.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Mapping

import torch

POINTER = "LATEST"


class WeightsNotReachedError(RuntimeError):
    """A replica served an older weight version than the learner had pushed before asking."""


def check_served(served: int, pushed: int, weights_dir: str | Path) -> None:
    """Raise when a sample was generated with weights older than the version pushed before its
    request. Replicas read ``LATEST`` before every request, so this only happens when the push
    does not reach them: most often a replica on another node than the learner's rank 0, whose
    node-local ``weights_dir`` holds nothing (it would serve version 0 for ever, and a bounded-
    staleness learner would wait for fresh groups that never come)."""
    if served < pushed:
        raise WeightsNotReachedError(
            f"a rollout replica served weight version {served} after the learner had pushed version {pushed} "
            f"to {weights_dir}: the pushed weights do not reach it. With rollout.weight_transport=shm, "
            "rollout.weights_dir is read on the replica's own node: set rollout.weight_transport=object_store "
            "(weights go through Ray's object store to any node), run every rollout replica on the node of "
            "learner rank 0, or make rollout.weights_dir a directory that every node mounts")


def publish(weights_dir: str | Path, version: int, state: Mapping[str, torch.Tensor], keep: int = 2) -> Path:
    """Write ``state`` as version ``version`` and point LATEST at it."""
    from safetensors.torch import save_file

    d = Path(weights_dir)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"v{version}.safetensors"
    tmp = path.with_suffix(".tmp")
    save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, str(tmp))
    os.replace(tmp, path)
    ptmp = d / (POINTER + ".tmp")
    ptmp.write_text(json.dumps({"version": version, "path": str(path)}))
    os.replace(ptmp, d / POINTER)
    for old in d.glob("v*.safetensors"):
        try:
            if int(old.stem[1:]) <= version - keep:
                old.unlink(missing_ok=True)
        except ValueError:
            continue
    return path


def latest(weights_dir: str | Path) -> tuple[int, str | None]:
    """(version, file) of the newest push; (0, None) before the first."""
    p = Path(weights_dir) / POINTER
    try:
        data = json.loads(p.read_text())
        return int(data["version"]), str(data["path"])
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return 0, None
