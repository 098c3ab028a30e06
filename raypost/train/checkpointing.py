"""Checkpoints = DeepSpeed state of every rank + the controller state, reported to Ray Train.

Ray Train keeps them under ``RunConfig(storage_path, name)`` and hands the latest back via
``ray.train.get_checkpoint()`` after a worker-group restart or a re-run of the same command.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import ray.train
import torch.distributed as dist

from raypost.train.rng import load_rng, save_rng
from raypost.utils import storage
from raypost.utils.metrics import read_records

log = logging.getLogger("raypost")

DS_TAG = "ds"
STATE_FILE = "controller_state.json"
SAMPLES_FILE = "trained_samples.jsonl"
METRICS_FILE = "metrics.json"
HF_DIR = "hf"


@dataclass
class ControllerState:
    """Where a run is: optimizer steps done, data consumed (SFT: global batches; GRPO: prompt
    rows), and the weight version last pushed to the rollout replicas."""

    step: int = 0
    cursor: int = 0
    weight_version: int = 0
    order: dict[str, Any] = field(default_factory=dict)  # the settings the data order depends on (train.order)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ControllerState:
        return cls(**d)


CKPT_PREFIX = "raypost-ckpt-"  # + the pid of the worker that stages a checkpoint there


def sweep_orphans(root: str | None = None) -> list[Path]:
    """Remove the checkpoint staging folders of workers that died before they could (a SIGKILLed
    worker leaves one whole shard in /tmp); a folder whose process is alive is left alone."""
    removed = []
    for folder in Path(root or tempfile.gettempdir()).glob(f"{CKPT_PREFIX}*-*"):
        pid = folder.name[len(CKPT_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: a check, nothing is sent
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def save_and_report(
    engine: Any,
    state: ControllerState,
    metrics: dict[str, Any],
    rank: int,
    hf_export: Any = None,
    run_dir: str | Path | None = None,
    extra: dict[str, Any] | None = None,
) -> None:
    """Every rank saves its DeepSpeed shard (and one of each ``extra`` engine, such as PPO's
    critic, under its name's tag); rank 0 adds the controller state (and an HF
    export when ``hf_export`` is a callable taking a folder). Ray merges the folders. For a run
    stored at a URI, rank 0 first mirrors ``run_dir`` (its metrics and records) there: once Ray
    has recorded the checkpoint, the records of every step up to it are in the bucket. A kill
    between the two leaves lines of later steps there, which the resumed run drops (``rewind_logs``)."""
    if rank == 0 and run_dir is not None:
        storage.push(run_dir)
    sweep_orphans()
    with tempfile.TemporaryDirectory(prefix=f"{CKPT_PREFIX}{os.getpid()}-") as tmp:
        engine.save_checkpoint(tmp, tag=DS_TAG, client_state={"controller": state.to_dict()})
        for tag, other in (extra or {}).items():
            other.save_checkpoint(tmp, tag=tag, save_latest=False)
        save_rng(tmp, rank)
        if hf_export is not None:
            hf_export(Path(tmp) / HF_DIR)
        if rank == 0:
            (Path(tmp) / STATE_FILE).write_text(json.dumps(state.to_dict()))
            (Path(tmp) / METRICS_FILE).write_text(json.dumps(metrics, default=str))
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(tmp))


def restore(engine: Any, start_from: str | None = None) -> ControllerState:
    """Load the latest checkpoint of this run into ``engine``, else the one at ``start_from``
    (a checkpoint folder of another run: PBT's exploit), else return a fresh state."""
    ckpt = ray.train.get_checkpoint()
    if ckpt is None and start_from is not None:
        ckpt = ray.train.Checkpoint(start_from)
    if ckpt is None:
        return ControllerState()
    with ckpt.as_directory() as d:
        _, client = engine.load_checkpoint(d, tag=DS_TAG, load_optimizer_states=True, load_lr_scheduler_states=True)
        load_rng(d, dist.get_rank() if dist.is_initialized() else 0)
        if client and "controller" in client:
            return ControllerState.from_dict(client["controller"])
        return ControllerState.from_dict(json.loads((Path(d) / STATE_FILE).read_text()))


def restore_extra(engine: Any, tag: str) -> bool:
    """Load an engine saved beside the learner's (``save_and_report``'s ``extra``) from the same
    checkpoint ``restore`` loads; False when there is none."""
    ckpt = ray.train.get_checkpoint()
    if ckpt is None:
        return False
    with ckpt.as_directory() as d:
        if not (Path(d) / tag).is_dir():
            raise FileNotFoundError(f"checkpoint {ckpt.path} has no '{tag}' engine: it was saved by another learner")
        engine.load_checkpoint(d, tag=tag, load_optimizer_states=True, load_lr_scheduler_states=True)
    return True


def log_trained(run_dir: str | Path, step: int, sample_ids: list[str]) -> None:
    """Append which samples ``step`` trained on: the record that resume neither skips nor repeats."""
    with open(Path(run_dir) / SAMPLES_FILE, "a") as fh:
        fh.write(json.dumps({"step": step, "ids": sample_ids}) + "\n")


def rewind_logs(run_dir: str | Path, step: int, phase: str) -> int:
    """After a restore at ``step`` (0: no checkpoint, the run starts over), drop the lines of later
    steps from ``trained_samples.jsonl`` and (for ``phase``) ``metrics.jsonl``: they were trained
    after the checkpoint by a model state that the failure discarded, and are trained again. The
    logs then say what the surviving model learned from, each sample once. Returns how many lines
    were dropped."""
    dropped = 0
    for name, stale in (
        (SAMPLES_FILE, lambda r: r["step"] > step),
        ("metrics.jsonl", lambda r: r.get("phase") == phase and r["step"] > step),
    ):
        path = Path(run_dir) / name
        rows, torn = read_records(path)
        keep = [r for r in rows if not stale(r)]
        if torn or len(keep) < len(rows):
            path.write_text("".join(json.dumps(r) + "\n" for r in keep))
            dropped += len(rows) - len(keep) + torn
    return dropped


def rewind_on_start(run_dir: str | Path, state: ControllerState, phase: str) -> None:
    """Rank 0 at every learner start: take the records as the run's URI holds them (this node's
    copy may be short), rewind them to the restored step, step 0 included (a worker group
    restarted before any checkpoint registered starts over), and say so."""
    storage.fetch_records(run_dir, (SAMPLES_FILE, "metrics.jsonl"))
    dropped = rewind_logs(run_dir, state.step, phase)
    if state.step or dropped:
        log.info(
            "resumed at step %d (cursor %d, weight version %d); %d log lines after it rewound",
            state.step,
            state.cursor,
            state.weight_version,
            dropped,
        )


def finished_checkpoint(run_dir: str | Path) -> Path | None:
    """The run's final checkpoint (the one with the HF export), if the run has finished."""
    done = sorted(p.parent for p in Path(run_dir).glob(f"**/checkpoint_*/{HF_DIR}"))
    return done[-1] if done else None


def hf_exporter(engine: Any, zero_stage: int, tokenizer: Any, rank: int):
    """A callable that writes an HF export of ``engine``'s model into a folder (rank 0), or
    None on other ranks. Every rank must call this: ZeRO-3 gathers the weights."""
    from raypost.train.engine import full_state_dict

    state = full_state_dict(engine, zero_stage)
    if rank != 0:
        return None
    from raypost.models.hf import export_hf

    return lambda folder: export_hf(engine.module, tokenizer, folder, state_dict=state)
