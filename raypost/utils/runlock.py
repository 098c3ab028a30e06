"""One driver per run folder: two drivers with the same ``run.name`` and storage would write
each other's checkpoints, records and Serve apps. The first takes an exclusive lock on
``<run>/.raypost.lock`` for its life (released by the OS when it exits, however it ends); a
second waits up to ``run.lock_wait_s`` for it (a re-submitted job may start while the driver a
head failure orphaned is still exiting), then is refused with the holder named. The lock
covers one machine's working copy."""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import time
from pathlib import Path

from raypost.config.base import ConfigError

LOCK_FILE = ".raypost.lock"


class RunInUseError(ConfigError):
    """Another live driver holds the run folder."""


def _locked(fd: int, wait_s: float, path: Path) -> bool:
    """Whether the exclusive lock was taken within ``wait_s``."""
    deadline, said = time.monotonic() + wait_s, False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            if not said:
                holder = path.read_text().strip() or "unknown"
                logging.getLogger("raypost").warning("%s is held by %s; waiting up to %.0f s", path, holder, wait_s)
                said = True
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


def hold_run(run_dir: str | Path, wait_s: float = 0.0) -> int:
    """Lock ``run_dir`` for this process's life, waiting up to ``wait_s`` for another holder;
    returns the lock's descriptor (kept open on purpose: closing it releases the lock).
    RunInUseError names the holder when another live process keeps it."""
    path = Path(run_dir) / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    if not _locked(fd, wait_s, path):
        holder = path.read_text().strip() or "unknown"
        os.close(fd)
        raise RunInUseError(
            f"run folder {run_dir} is in use by another raypost driver ({holder}): two runs with one "
            "run.name would overwrite each other's checkpoints and records. Wait for it to end, stop it, "
            "or pass another --run.name"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
    return fd
