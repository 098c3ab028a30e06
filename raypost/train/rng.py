"""Each rank's random state in its checkpoints (torch, CUDA, Python, NumPy), so a resumed
learner draws what the uninterrupted one would have (dropout, any sampling in a step). Saved
as tensors and plain numbers, and read back with ``torch.load(weights_only=True)``."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

RNG_DIR = "rng"


def _path(folder: str | Path, rank: int) -> Path:
    return Path(folder) / RNG_DIR / f"rank_{rank}.pt"


def save_rng(folder: str | Path, rank: int) -> None:
    """Write this rank's random state into the checkpoint ``folder``."""
    version, keys, gauss = random.getstate()
    name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "python": {"version": version, "keys": torch.tensor(keys, dtype=torch.int64), "gauss": gauss},
        "numpy": {"keys": torch.from_numpy(np_keys.astype(np.int64)), "pos": np_pos, "has_gauss": np_has_gauss},
        "numpy_gauss": float(np_gauss),
    }
    _path(folder, rank).parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, _path(folder, rank))


def load_rng(folder: str | Path, rank: int) -> bool:
    """Restore this rank's random state from the checkpoint ``folder``; False when it has none
    (a checkpoint from before the state was saved, or another world size)."""
    path = _path(folder, rank)
    if not path.is_file():
        return False
    state = torch.load(path, weights_only=True)
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])
    py = state["python"]
    random.setstate((py["version"], tuple(int(k) for k in py["keys"]), py["gauss"]))
    npy = state["numpy"]
    keys = npy["keys"].numpy().astype(np.uint32)
    np.random.set_state(("MT19937", keys, int(npy["pos"]), int(npy["has_gauss"]), state["numpy_gauss"]))
    return True
