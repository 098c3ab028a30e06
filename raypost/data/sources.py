"""Read a data source into a Ray Dataset of normalized rows (see ``rows.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import ray.data

from raypost.config import DataConfig
from raypost.data import synthetic
from raypost.data.rows import RowSchema, qa_schema


def _normalize_frame(batch: pd.DataFrame, schema: RowSchema) -> pd.DataFrame:
    rows = [schema.normalize(r) for r in batch.to_dict(orient="records")]
    return pd.DataFrame(rows, columns=schema.columns)


def _synthetic_frame(batch: pd.DataFrame, schema: RowSchema) -> pd.DataFrame:
    """Normalized synthetic rows; a row's noisy ``demo``, if any, becomes its SFT target."""
    rows = []
    for raw in batch.to_dict(orient="records"):
        row = schema.normalize(raw)
        if raw.get("demo"):
            row["solution"] = raw["demo"]
        rows.append(row)
    return pd.DataFrame(rows, columns=schema.columns)


def _parse_lines(batch: pd.DataFrame, schema: RowSchema) -> pd.DataFrame:
    lines = [t for t in batch["text"].tolist() if t.strip()]
    return pd.DataFrame([schema.parse_line(t) for t in lines], columns=schema.columns)


def num_blocks(rows: int, rows_per_block: int = 4000) -> int:
    """Few, large blocks: Ray Data's default (200 blocks) makes small data slow on few cores."""
    return max(1, min(64, -(-rows // rows_per_block)))


def _check_path(path: str, what: str) -> None:
    if not Path(path).exists():
        raise FileNotFoundError(f"data.{what}: '{path}' does not exist; give a file or folder that does")


def read_source(cfg: DataConfig, path: str | None, split: str, schema: RowSchema | None = None) -> ray.data.Dataset:
    """Rows of ``path`` (or the synthetic task's ``split``) as normalized rows with rejects.
    ``schema`` validates each row (default: question/answer rows named by the config)."""
    kw: dict[str, Any] = {"schema": schema or qa_schema(cfg.prompt_field, cfg.answer_field)}
    if cfg.source == "synthetic":
        rows = synthetic_rows(cfg, split)
        return ray.data.from_items(rows, override_num_blocks=num_blocks(len(rows))).map_batches(
            _synthetic_frame, batch_format="pandas", fn_kwargs={"schema": qa_schema("question", "answer")}
        )
    assert path is not None
    if cfg.source == "jsonl":
        _check_path(path, "path")
        return ray.data.read_text(path).map_batches(_parse_lines, batch_format="pandas", fn_kwargs=kw)
    if cfg.source == "parquet":
        _check_path(path, "path")
        return ray.data.read_parquet(path).map_batches(_normalize_frame, batch_format="pandas", fn_kwargs=kw)
    import datasets  # HF datasets: a hub id or a local dataset folder/file

    hf = datasets.load_dataset(path, name=cfg.hf_config, split=split)
    return (
        ray.data.from_huggingface(hf)
        .repartition(num_blocks(len(hf)))
        .map_batches(_normalize_frame, batch_format="pandas", fn_kwargs=kw)
    )


def synthetic_rows(cfg: DataConfig, split: str) -> list[dict[str, Any]]:
    """The synthetic task's train or eval problems; eval never repeats a train question and has
    no noisy demos. Every row has a ``demo`` key ('' when it has none) so the rows share columns."""
    s = cfg.synthetic
    train = synthetic.generate(
        s.num_train, s.seed, s.max_operand, s.two_step_fraction, prefix="train", guess_fraction=s.guess_fraction
    )
    if split == "train":
        return [{"demo": "", **r} for r in train]
    seen = {r["question"] for r in train}
    pool = synthetic.generate(s.num_eval * 2, s.seed + 1, s.max_operand, s.two_step_fraction, prefix="eval")
    return [{**r, "demo": ""} for r in pool if r["question"] not in seen][: s.num_eval]
