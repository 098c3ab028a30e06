"""The offline teacher pass: Ray Data ``map_batches`` over packed SFT rows keeps the
teacher's top-k next-token log-probs per position, so the student's KD data stays bounded
(k values per token instead of the vocabulary).

Each row gains ``teacher_ids`` and ``teacher_logprobs``: flat lists of ``len(input_ids) * k``
(position-major), read back by ``data.collate.collate`` as ``[B, T, k]``.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import ray.data
import torch

from raypost.data.preprocess import actor_pool
from raypost.utils.alloc import jemalloc_env


class TeacherTopK:
    """Ray Data callable class: packed rows -> rows with the teacher's top-k per position."""

    def __init__(self, model_path: str, top_k: int, precision: str = "fp32", threads: int | None = None) -> None:
        from raypost.models.hf import load_causal_lm, load_tokenizer

        if threads:
            torch.set_num_threads(threads)
        self.model = load_causal_lm(model_path, precision).eval()
        self.pad_id = load_tokenizer(model_path).pad_token_id
        self.k = top_k

    @torch.no_grad()
    def __call__(self, batch: pd.DataFrame) -> pd.DataFrame:
        from raypost.data.collate import collate

        rows = batch.to_dict("records")
        inputs = collate(rows, self.pad_id)
        logits = self.model(
            input_ids=inputs["input_ids"],
            attention_mask=inputs["attention_mask"],
            position_ids=inputs["position_ids"],
            use_cache=False,
        ).logits
        values, ids = torch.log_softmax(logits.float(), -1).topk(self.k, dim=-1)
        out = batch.copy()
        lengths = [len(r["input_ids"]) for r in rows]
        out["teacher_ids"] = [ids[i, :n].reshape(-1).numpy().astype(np.int32) for i, n in enumerate(lengths)]
        out["teacher_logprobs"] = [values[i, :n].reshape(-1).numpy().astype(np.float32) for i, n in enumerate(lengths)]
        return out


@dataclass(frozen=True)
class TeacherSignal:
    """What the offline-KD learner needs from the teacher, and how the pass is run."""

    model_path: str
    top_k: int
    kd: dict[str, Any]  # KDParams fields, sent to the learner
    precision: str = "fp32"
    cpus: float = 1.0
    batch_size: int = 16
    # A dict shared by runs that annotate the same rows (a PBT trial's segments): the teacher
    # pass then runs once and later runs reuse its materialized result.
    cache: dict[str, Any] | None = field(default=None, compare=False, repr=False)

    def annotate(self, rows: ray.data.Dataset) -> ray.data.Dataset:
        """``rows`` with teacher columns, in the same order (materialized)."""
        if self.cache is not None and "rows" in self.cache:
            return self.cache["rows"]
        annotated = rows.map_batches(  # in order: Ray Data keeps block order (configure_ray_data)
            TeacherTopK,
            batch_format="pandas",
            batch_size=self.batch_size,
            num_cpus=self.cpus,
            runtime_env=jemalloc_env(),
            **actor_pool(),
            fn_constructor_kwargs={
                "model_path": self.model_path,
                "top_k": self.top_k,
                "precision": self.precision,
                "threads": max(1, int(self.cpus)),
            },
        ).materialize()
        if self.cache is not None:
            self.cache["rows"] = annotated
        return annotated


def write_topk(rows: ray.data.Dataset, path: Path, top_k: int) -> dict[str, int]:
    """Write the teacher columns of annotated ``rows`` (ids int32 and log-probs float32, ``top_k``
    of each per token) as Parquet into ``path``; return ``{"tokens", "bytes"}`` (on disk)."""
    shutil.rmtree(path, ignore_errors=True)
    rows.select_columns(["teacher_ids", "teacher_logprobs"]).write_parquet(str(path))
    counts = rows.map_batches(
        lambda b: pd.DataFrame({"n": [len(x) // top_k for x in b["teacher_ids"]]}), batch_format="pandas"
    )
    return {"tokens": int(counts.sum("n") or 0), "bytes": sum(f.stat().st_size for f in path.rglob("*.parquet"))}
