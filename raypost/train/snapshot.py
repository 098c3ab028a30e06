"""A last good copy of Ray Train's run snapshot, so that a torn one cannot brick a resume.

Ray Train keeps the list of a run's checkpoints in ``<run>/checkpoint_manager_snapshot.json`` and
rewrites it in place after each checkpoint (``CheckpointManager._write_state_to_storage`` opens
the file for writing, truncating it, then writes). A full disk or a kill in between leaves it
empty or cut short, and every later start of the run fails in Ray Train's
``CheckpointManager.__init__`` (``CheckpointManagerInitializationError: Expecting value``),
whatever is freed: the ``disk`` drill of ``benchmarks/chaos.py`` found it.

``SnapshotKeeper`` runs in the Train controller after each report: once Ray Train has written
the snapshot, it copies it (when it parses) to ``checkpoint_manager_snapshot.last_good.json``
through a temp file and a rename, so the copy is whole or absent. ``restore_snapshot`` runs on the
driver before the trainer starts: a snapshot that does not parse is replaced by that copy.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import ray.train

SNAPSHOT = "checkpoint_manager_snapshot.json"
LAST_GOOD = "checkpoint_manager_snapshot.last_good.json"
log = logging.getLogger("raypost")


def _parses(path: Path) -> bool:
    try:
        json.loads(path.read_text())
        return True
    except (OSError, ValueError):
        return False


def _write_whole(path: Path, text: str) -> None:
    """``text`` to ``path`` through a temp file and a rename: whole or not at all."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with tmp.open("w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def keep_copy(run_dir: str | Path) -> bool:
    """Copy the run's snapshot to the last good copy if it parses; False if it did not (or the
    copy could not be written: a full disk keeps the previous copy)."""
    src = Path(run_dir) / SNAPSHOT
    if not _parses(src):
        return False
    try:
        _write_whole(Path(run_dir) / LAST_GOOD, src.read_text())
    except OSError as err:
        log.warning("could not keep a copy of %s (%s); the previous copy stays", src, err)
        return False
    return True


def restore_snapshot(run_dir: str | Path) -> bool:
    """Before a (re)start: replace a snapshot that does not parse by the last good copy; True if
    it did. A torn snapshot with no good copy is an error naming the file and the fix."""
    run_dir = Path(run_dir)
    snap, good = run_dir / SNAPSHOT, run_dir / LAST_GOOD
    if not snap.exists() or _parses(snap):
        return False
    if not _parses(good):
        raise RuntimeError(
            f"{snap} is torn (a full disk or a kill while Ray Train wrote it) and no good copy "
            f"({LAST_GOOD}) exists: Ray Train cannot resume this run. Free the disk, then delete the "
            "file to start the run over, or pass another --run.name"
        )
    _write_whole(snap, good.read_text())
    log.warning("%s was torn (a full disk or a kill while Ray Train wrote it): restored from %s", snap, good.name)
    return True


class SnapshotKeeper(ray.train.UserCallback):
    """Keeps the last good copy of the snapshot of ``run_dir`` after each checkpoint (in the
    Train controller, after Ray Train has written the snapshot)."""

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
        if checkpoint is not None and Path(self.run_dir).is_dir():
            keep_copy(self.run_dir)
