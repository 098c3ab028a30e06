"""The Ray Data preprocessing pipeline: read -> normalize -> chat template + tokenize ->
length filter -> (SFT) pack. Rejects are counted, logged and written with their reason.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray.data

from raypost.config import DataConfig
from raypost.data.packing import pack_frame
from raypost.data.rows import RowSchema
from raypost.data.sources import read_source
from raypost.data.tokenize import Tokenize

log = logging.getLogger("raypost.data")


class DataError(RuntimeError):
    """The data cannot be used at all (for example: every row was rejected)."""


@dataclass
class SplitCounts:
    read: int = 0
    kept: int = 0
    reasons: Counter = field(default_factory=Counter)

    @property
    def rejected(self) -> int:
        return self.read - self.kept

    def as_dict(self) -> dict:
        return {"read": self.read, "kept": self.kept, "rejected": self.rejected, "reasons": dict(self.reasons)}


def _in_eval(row_id: str, fraction: float) -> bool:
    return int(hashlib.sha1(row_id.encode()).hexdigest()[:8], 16) % 10_000 < fraction * 10_000


def read_splits(cfg: DataConfig, schema: RowSchema | None = None) -> tuple[ray.data.Dataset, ray.data.Dataset]:
    """Normalized train and eval rows (materialized). Eval comes from eval_path, the
    synthetic eval seed, or a stable hash split of ids (no row is in both). ``schema``
    validates rows (default: question/answer)."""
    train = read_source(cfg, cfg.path, cfg.hf_split if cfg.source == "hf" else "train", schema).materialize()
    if cfg.source == "synthetic":
        return train, read_source(cfg, None, "eval").materialize()
    if cfg.eval_path is not None:
        return train, read_source(cfg, cfg.eval_path, "test", schema).materialize()
    frac = cfg.eval_fraction
    is_eval = lambda r: r["reject"] == "" and _in_eval(r["id"], frac)  # noqa: E731
    return (train.filter(lambda r: not is_eval(r)).materialize(), train.filter(is_eval).materialize())


def actor_pool(size: int = 1) -> dict[str, Any]:
    """``map_batches`` arguments for a pool of ``size`` actors that Ray never restarts.

    Ray Data's pools default to ``max_restarts=-1`` and release their actors by dropping the
    handle, so that the actors can be restarted to reconstruct lost blocks. The GCS then keeps each
    one as DEAD (out of scope) but restartable for as long as the dataset's blocks are referenced,
    and a GCS that reloads such an actor from Redis after a head crash aborts (docs/recovery.md).
    A raypost pass is short and the run resumes from its checkpoints, so an actor that dies fails
    the pass instead."""
    return {"compute": ray.data.ActorPoolStrategy(size=size), "max_restarts": 0}


@functools.lru_cache(maxsize=4)
def _udf(cls: type, kwargs: tuple[tuple[str, Any], ...]) -> Any:
    return cls(**dict(kwargs))


def _call_udf(batch: Any, cls: type, kwargs: tuple[tuple[str, Any], ...]) -> Any:
    return _udf(cls, kwargs)(batch)


def map_light(ds: ray.data.Dataset, cls: type, **kwargs: Any) -> ray.data.Dataset:
    """``ds.map_batches(cls)`` for a light callable class (a tokenizer) as Ray Data *tasks*: each
    worker process builds ``cls(**kwargs)`` once and keeps it for later batches and passes (both
    splits, every phase of the run). Tasks run on Ray's pooled workers, where an actor pool
    starts new processes for each pass (13-15 s each here, for 40 rows), and leave no actor
    behind for a restarted GCS to trip on. ``kwargs`` must be hashable."""
    return ds.map_batches(_call_udf, batch_format="pandas", fn_args=(cls, tuple(sorted(kwargs.items()))))


def tokenize(ds: ray.data.Dataset, tokenizer_path: str, cfg: DataConfig) -> ray.data.Dataset:
    """Add prompt_ids/completion_ids; over-long rows become rejects."""
    return map_light(
        ds,
        Tokenize,
        tokenizer_path=tokenizer_path,
        system_prompt=cfg.system_prompt,
        prompt_template=cfg.prompt_template,
        max_seq_len=cfg.max_seq_len,
    ).materialize()


def split_rejects(ds: ray.data.Dataset, split: str, rejects_path: Path) -> tuple[ray.data.Dataset, SplitCounts]:
    """Good rows, and the counts; rejects are appended to ``rejects_path`` as JSONL: split, file,
    line (from 1), reason, raw."""
    counts = SplitCounts(read=ds.count())
    rejects = ds.filter(expr="reject != ''")
    rejects_path.parent.mkdir(parents=True, exist_ok=True)
    with rejects_path.open("a") as fh:
        for row in rejects.iter_rows():
            counts.reasons[row["reject"].split(":")[0]] += 1
            file, _, line = row["where"].rpartition(":")
            record = {"split": split, "file": file, "line": int(line) if line.isdigit() else None}
            fh.write(json.dumps({**record, "reason": row["reject"], "raw": row["raw"]}) + "\n")
    good = ds.filter(expr="reject == ''").drop_columns(["raw", "reject", "where"]).materialize()
    counts.kept = good.count()
    log.info(
        "data[%s]: read %d, kept %d, rejected %d %s (see %s)",
        split,
        counts.read,
        counts.kept,
        counts.rejected,
        dict(counts.reasons) or "",
        rejects_path,
    )
    if counts.kept == 0:
        raise DataError(
            f"every one of the {counts.read} {split} rows was rejected "
            f"({dict(counts.reasons)}); the reasons per row are in {rejects_path}"
        )
    return good, counts


def epoch_order(good: ray.data.Dataset, epochs: int, seed: int) -> ray.data.Dataset:
    """All epochs in one deterministic order, each its own seeded shuffle. Learners resume
    from a cursor into this order, so it must not change between runs of the same config."""
    per_epoch = [good.random_shuffle(seed=seed + e) for e in range(epochs)]
    if epochs == 1:
        return per_epoch[0]
    # One epoch after the other: Dataset.union would interleave the epochs' blocks (round-robin).
    return ray.data.from_arrow_refs([ref for epoch in per_epoch for ref in epoch.to_arrow_refs()])


def sft_rows(good: ray.data.Dataset, cfg: DataConfig, epochs: int, seed: int) -> ray.data.Dataset:
    """Training rows for all epochs (``epoch_order``), then examples are packed."""
    return (
        epoch_order(good, epochs, seed)
        .map_batches(
            pack_frame,
            batch_format="pandas",
            batch_size=256,
            fn_kwargs={"max_seq_len": cfg.max_seq_len, "pack": cfg.pack},
        )
        .materialize()
    )


def prompt_order(good: ray.data.Dataset, rows_needed: int, seed: int) -> ray.data.Dataset:
    """Prompts for RL in one deterministic order long enough for the run: as many seeded
    epoch shuffles as needed, concatenated. Resume is a row cursor into this order."""
    epochs = max(1, -(-rows_needed // good.count()))
    return epoch_order(good, epochs, seed).select_columns(["id", "question", "answer", "prompt_ids"]).materialize()
