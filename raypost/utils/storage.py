"""Runs stored at a URI: ``run.storage_path`` as ``s3://``, ``gs://`` or any pyarrow filesystem URI.

A run's code reads and writes a local folder, its *working copy*; the URI holds the durable copy:

* Ray Train writes every checkpoint straight to the URI, from each worker (``ray_storage``), as
  it does for any storage path; the checkpoint a training phase ends with is downloaded into the
  working copy (``local_checkpoint``), for the next phase to go on from.
* Everything else (metrics, trained-sample records, phase markers, the report) is written into
  the working copy and mirrored to the URI (``push``): by learner rank 0 at each checkpoint and by
  the driver at the end of the run.
* A run that starts on a machine without a working copy, or with an older one, first fetches
  what the URI holds (``pull``), and so resumes where the last machine stopped.

The working copy lies under ``RAYPOST_STORAGE_CACHE`` (default ``~/.cache/raypost/storage``), in a
folder named after the URI, so every node (and a later machine) maps it back to its URI with
no other record. Local paths (no scheme, or ``file://``) are used as they are.

Credentials come from the filesystem's usual environment (e.g. ``AWS_ACCESS_KEY_ID``), not the URI.
"""

from __future__ import annotations

import base64
import datetime
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

PREFIX = "uri-"
CHECKPOINT = "checkpoint_"
HF_DIR = "hf"  # checkpointing.HF_DIR
SLACK = datetime.timedelta(seconds=2)


def is_uri(storage_path: str) -> bool:
    return "://" in storage_path and not storage_path.startswith("file://")


def cache_root() -> Path:
    return Path(os.environ.get("RAYPOST_STORAGE_CACHE", "~/.cache/raypost/storage")).expanduser()


def working_copy(storage_path: str) -> Path:
    """The local folder that stands for ``storage_path``: itself when local, else its working copy."""
    if not is_uri(storage_path):
        return Path(storage_path.removeprefix("file://")).expanduser().resolve()
    token = base64.urlsafe_b64encode(storage_path.encode()).decode().rstrip("=")
    return cache_root() / f"{PREFIX}{token}"


def remote_of(local: str | Path) -> tuple[Any, str] | None:
    """(pyarrow filesystem, path on it) of a folder inside a working copy; None for a local run."""
    parts = Path(local).parts
    for i, part in enumerate(parts):  # any process maps it, whatever its RAYPOST_STORAGE_CACHE
        uri = _decoded(part)
        if uri is not None:
            return _remote(uri, parts[i + 1 :])
    return None


def _decoded(part: str) -> str | None:
    """The URI a working-copy folder name stands for; None for any other name."""
    if not part.startswith(PREFIX):
        return None
    token = part[len(PREFIX) :]
    try:
        uri = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
    except (ValueError, UnicodeDecodeError):
        return None
    return uri if is_uri(uri) else None


def _remote(uri: str, rest: tuple[str, ...]) -> tuple[Any, str]:
    from pyarrow import fs

    filesystem, root = fs.FileSystem.from_uri(uri)
    return filesystem, "/".join([root.rstrip("/"), *rest])


def ray_storage(local: str | Path) -> dict[str, Any]:
    """``ray.train.RunConfig`` storage arguments for the run folder root ``local``."""
    remote = remote_of(local)
    if remote is None:
        return {"storage_path": str(Path(local).expanduser().resolve())}
    filesystem, path = remote
    return {"storage_path": path, "storage_filesystem": filesystem}


def pull(local: str | Path, exports: bool = True) -> int:
    """Fetch into the working copy ``local`` every file the URI holds that it lacks or holds older.
    Of checkpoints, only their HF exports (``exports``: a resumed run's finished phases go on from
    them; Ray Train reads the rest from the URI when it resumes). Returns files fetched."""
    remote = remote_of(local)
    if remote is None:
        return 0
    return _copy_newer(*remote, _local_fs(), str(local), keep=lambda rel: _mirrored(rel, exports))


def push(local: str | Path) -> int:
    """Mirror the working copy ``local`` to its URI (checkpoints are Ray Train's to write). Returns
    files sent; 0 for a local run."""
    remote = remote_of(local)
    if remote is None or not Path(local).exists():
        return 0
    return _copy_newer(_local_fs(), str(local), *remote, keep=lambda rel: _mirrored(rel, False))


def fetch_records(local: str | Path, names: tuple[str, ...]) -> int:
    """The records ``names`` (append-only JSONL) of the run as its URI holds them, over the working
    copy's: at a learner's start, rank 0 may run on a node whose copy is short or missing, and
    its next mirror would otherwise put that short copy over the bucket's. The bucket holds every
    record up to the last reported checkpoint (``save_and_report`` mirrors first), which is all a
    resumed learner keeps (it rewinds past it). Returns files fetched; 0 for a local run."""
    from pyarrow import fs

    remote = remote_of(local)
    if remote is None:
        return 0
    src_fs, root = remote
    fetched = 0
    for name in names:
        src = f"{root.rstrip('/')}/{name}"
        if src_fs.get_file_info(src).type != fs.FileType.File:
            continue
        Path(local).mkdir(parents=True, exist_ok=True)
        fs.copy_files(src, str(Path(local) / name), source_filesystem=src_fs, destination_filesystem=_local_fs())
        fetched += 1
    return fetched


def local_checkpoint(checkpoint: Any, local_run: str | Path) -> Any:
    """``checkpoint`` (of the run whose working-copy folder is ``local_run``) as a local Ray
    checkpoint: itself when local, else downloaded once into the working copy, where Ray wrote it
    on the URI."""
    from pyarrow import fs
    from ray.train import Checkpoint

    if checkpoint is None or isinstance(checkpoint.filesystem, fs.LocalFileSystem):
        return checkpoint
    local = Path(local_run) / Path(checkpoint.path).name
    _copy_newer(checkpoint.filesystem, checkpoint.path, _local_fs(), str(local), keep=lambda rel: True)
    return Checkpoint(str(local))


def _local_fs() -> Any:
    from pyarrow import fs

    return fs.LocalFileSystem()


def _mirrored(rel: str, exports_too: bool) -> bool:
    """Whether ``rel`` goes between a working copy and its URI: not checkpoints (Ray Train's),
    not a machine's own lock of the run folder."""
    return not _in_checkpoint(rel, exports_too) and rel != ".raypost.lock"


def _in_checkpoint(rel: str, exports_too: bool) -> bool:
    """Whether ``rel`` lies in a checkpoint folder (an HF export inside one counts only if not ``exports_too``)."""
    parts = rel.split("/")
    at = next((i for i, p in enumerate(parts) if p.startswith(CHECKPOINT)), None)
    if at is None:
        return False
    return not (exports_too and len(parts) > at + 1 and parts[at + 1] == HF_DIR)


def _copy_newer(src_fs: Any, src: str, dst_fs: Any, dst: str, keep: Callable[[str], bool]) -> int:
    """Copy each file under ``src`` (``keep(relative path)``) that ``dst`` lacks, holds with another
    size or holds older."""
    from pyarrow import fs

    try:
        found = src_fs.get_file_info(fs.FileSelector(src, recursive=True, allow_not_found=True))
    except FileNotFoundError:
        return 0
    sent = 0
    for info in found:
        if info.type != fs.FileType.File:
            continue
        rel = info.path[len(src.rstrip("/")) + 1 :]
        if not keep(rel):
            continue
        target = f"{dst.rstrip('/')}/{rel}"
        have = dst_fs.get_file_info(target)
        # (object stores keep whole seconds: a copy up to 2 s older than its source counts as current)
        older = info.mtime is not None and have.mtime is not None and have.mtime < info.mtime - SLACK
        if have.type == fs.FileType.File and have.size == info.size and not older:
            continue
        dst_fs.create_dir(target.rsplit("/", 1)[0], recursive=True)
        fs.copy_files(info.path, target, source_filesystem=src_fs, destination_filesystem=dst_fs)
        sent += 1
    return sent
