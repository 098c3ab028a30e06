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
