"""Last good copies of Ray Train's run snapshot, so that a torn one cannot brick a resume.

Ray Train keeps the list of a run's checkpoints in ``<run>/checkpoint_manager_snapshot.json`` and
rewrites it in place after each checkpoint (Ray 2.60, ``CheckpointManager._write_state_to_storage``
opens the file for writing, truncating it, then writes). A full disk or a kill in between leaves it
empty or cut short, and every later start of the run fails in Ray Train's
``CheckpointManager.__init__`` (``CheckpointManagerInitializationError: Expecting value``),
whatever is freed: the ``disk`` drill of ``benchmarks/chaos.py`` found it.

``SnapshotKeeper`` runs in the Train controller after each report: once Ray Train has written the
snapshot, it copies it (when it parses) into one of two slots, in turn, each tagged with a sequence
number. The driver reserves the slots' space before the trainer starts (``restore_snapshot``), and
a copy is written into that space in place: a disk that fills up later cannot stop it, and a copy
torn by a kill leaves the other slot. Before a start, a snapshot that does not parse is replaced by
the newest slot that does; if none does, no checkpoint of the run was ever recorded whole (the
first snapshot was the one torn): the torn file is set aside and the run starts over.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import ray.train

SNAPSHOT = "checkpoint_manager_snapshot.json"
SLOTS = ("checkpoint_manager_snapshot.good0.json", "checkpoint_manager_snapshot.good1.json")
TORN = "checkpoint_manager_snapshot.torn.json"
RESERVE_BYTES = 1 << 20  # per slot: Ray Train's snapshot of a few kept checkpoints is a few kB
log = logging.getLogger("raypost")


def _parse(text: str) -> Any:
    try:
        return json.loads(text.rstrip("\0 \n"))  # a slot is padded with spaces to its reserved size
    except ValueError:
        return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return ""


def _slot(path: Path) -> tuple[int, str] | None:
    """A slot's (sequence number, snapshot text), or None if it holds no whole copy."""
    body = _parse(_read(path))
    if not isinstance(body, dict) or _parse(str(body.get("snapshot", ""))) is None:
        return None
    return int(body.get("seq", 0)), body["snapshot"]


def _write_whole(path: Path, data: bytes, size: int) -> None:
    """``data`` padded to ``size`` bytes, to ``path`` through a temp file and a rename."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with tmp.open("wb") as fh:
            if size:
                os.posix_fallocate(fh.fileno(), 0, size)  # the space is the slot's from now on
            fh.write(data.ljust(size))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def reserve(run_dir: str | Path) -> None:
    """Allocate both slots' space now, while the disk has room (a slot's copy stays as it is)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    for name in SLOTS:
        path = run_dir / name
        if path.exists() and path.stat().st_size >= RESERVE_BYTES:
            continue
        try:
            _write_whole(path, _read(path).rstrip("\0 \n").encode(), RESERVE_BYTES)
        except OSError as err:
            log.warning("could not reserve %s (%s): a full disk may leave this run no copy", path, err)


def keep_copy(run_dir: str | Path) -> bool:
    """Copy the run's snapshot, if it parses, into the older slot; False if it did not parse (or
    the copy could not be written: the other slot keeps the previous copy)."""
    run_dir = Path(run_dir)
    text = _read(run_dir / SNAPSHOT)
    if _parse(text) is None:
        return False
    slots = [_slot(run_dir / name) for name in SLOTS]
    seq = 1 + max((s[0] for s in slots if s is not None), default=0)
    path = run_dir / SLOTS[seq % 2]
    data = json.dumps({"seq": seq, "snapshot": text}).encode()
    try:
        size = path.stat().st_size if path.exists() else 0
        if len(data) <= size:  # into its reserved space: needs no free disk
            with path.open("r+b") as fh:
                fh.write(data.ljust(size))
                fh.flush()
                os.fsync(fh.fileno())
        else:
            _write_whole(path, data, max(RESERVE_BYTES, 2 * len(data)))
    except OSError as err:
        log.warning("could not keep a copy of %s (%s); the previous copy stays", run_dir / SNAPSHOT, err)
        return False
    return True


def restore_snapshot(run_dir: str | Path) -> bool:
    """Before a (re)start: replace a snapshot that does not parse by the newest whole copy (True
    if it did), or set it aside when there is none; then reserve the slots."""
    run_dir = Path(run_dir)
    snap = run_dir / SNAPSHOT
    restored = False
    if snap.exists() and _parse(_read(snap)) is None:
        copies = [s for s in (_slot(run_dir / name) for name in SLOTS) if s is not None]
        if copies:
            _write_whole(snap, max(copies)[1].encode(), 0)
            log.warning("%s was torn (a full disk or a kill while Ray Train wrote it): restored from a copy", snap)
            restored = True
        else:
            os.replace(snap, run_dir / TORN)
            log.warning(
                "%s was torn before any checkpoint of this run was recorded whole: it is set aside as %s, "
                "and the run starts over from step 0",
                snap,
                TORN,
            )
    reserve(run_dir)
    return restored


class SnapshotKeeper(ray.train.UserCallback):
    """Keeps the last good copies of the snapshot of ``run_dir`` after each checkpoint (in the
    Train controller, after Ray Train has written the snapshot)."""

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
        if checkpoint is not None and Path(self.run_dir).is_dir():
            keep_copy(self.run_dir)
