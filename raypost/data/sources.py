"""Read a data source into a Ray Dataset of normalized rows (see ``rows.py``).

Files are read as bytes and split on ``\\n`` only: each line is decoded and parsed on its own, so
an invalid UTF-8 byte, a U+2028 inside a string, a BOM or a line nested too deeply becomes one
reject with its file and line (the ``where`` column), and never fails the read. Parquet rows and
HF dataset rows carry their file (or dataset and split) and row number the same way.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import ray.data

from raypost.config import DataConfig
from raypost.data import synthetic
from raypost.data.rows import BOM, RowSchema, qa_schema

ROWS_PER_BATCH = 4096
EXTENSIONS = {"jsonl": ["jsonl", "json"], "parquet": ["parquet"]}


def _normalized(rows: list[dict[str, Any]], wheres: list[str], schema: RowSchema) -> pd.DataFrame:
    out = []
    for row, where in zip(rows, wheres):
        done = schema.checked(row, "")
        if done["reject"]:
            done["raw"] = done["raw"] or _short_json(row)
        out.append({**done, "where": where})
    return pd.DataFrame(out, columns=schema.columns)


def _short_json(row: Any) -> str:
    import json

    try:
        return json.dumps(row, default=str)[:2000]
    except (TypeError, ValueError, RecursionError):
        return repr(row)[:2000]


def _jsonl_file(batch: dict[str, Any], schema: RowSchema, max_bytes: int) -> Iterator[pd.DataFrame]:
    """The lines of each file of the batch (``path``, ``bytes``) -> normalized rows or rejects."""
    for path, data in zip(batch["path"], batch["bytes"]):
        data = bytes(data)
        lines = data[len(BOM) :].split(b"\n") if data.startswith(BOM) else data.split(b"\n")
        out = []
        for number, line in enumerate(lines, start=1):
            if line.strip():
                out.append({**schema.parse_line(line, max_bytes), "where": f"{path}:{number}"})
            if len(out) >= ROWS_PER_BATCH:
                yield pd.DataFrame(out, columns=schema.columns)
                out = []
        if out:
            yield pd.DataFrame(out, columns=schema.columns)


def _parquet_file(batch: dict[str, Any], schema: RowSchema) -> Iterator[pd.DataFrame]:
    """The rows of each Parquet file of the batch -> normalized rows; ``where`` is file:row (from 1)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for path, data in zip(batch["path"], batch["bytes"]):
        start = 1
        for part in pq.ParquetFile(pa.BufferReader(bytes(data))).iter_batches(batch_size=ROWS_PER_BATCH):
            rows = part.to_pylist()
            yield _normalized(rows, [f"{path}:{start + i}" for i in range(len(rows))], schema)
            start += len(rows)


def _hf_frame(batch: pd.DataFrame, schema: RowSchema, name: str) -> pd.DataFrame:
    rows = batch.drop(columns=["__row"]).to_dict(orient="records")
    return _normalized(rows, [f"{name}:{int(i)}" for i in batch["__row"]], schema)


def _synthetic_frame(batch: pd.DataFrame, schema: RowSchema, split: str) -> pd.DataFrame:
    """Normalized synthetic rows; a row's ``demo``, if any, becomes its SFT target (after its
    ``prior_turns``, if any)."""
    rows = []
    for raw in batch.to_dict(orient="records"):
        row = schema.normalize(raw)
        if raw.get("demo"):
            row["solution"], row["prior_turns"] = raw["demo"], raw.get("prior_turns") or ""
        rows.append({**row, "where": f"synthetic/{split}:{raw['id']}"})
    return pd.DataFrame(rows, columns=schema.columns)


def num_blocks(rows: int, rows_per_block: int = 4000) -> int:
    """Few, large blocks: Ray Data's default (200 blocks) makes small data slow on few cores."""
    return max(1, min(64, -(-rows // rows_per_block)))


def _files(path: str, source: str) -> ray.data.Dataset:
    """The files at ``path`` (one file, or a folder's files of the source's extensions) as bytes."""
    folder = "://" not in path and Path(path).is_dir()
    return ray.data.read_binary_files(path, include_paths=True, file_extensions=EXTENSIONS[source] if folder else None)


def read_source(cfg: DataConfig, path: str | None, split: str, schema: RowSchema | None = None) -> ray.data.Dataset:
    """Rows of ``path`` (or the synthetic task's ``split``) as normalized rows with rejects.
    ``schema`` validates each row (default: question/answer rows named by the config)."""
    schema = schema or qa_schema(cfg.prompt_field, cfg.answer_field)
    if cfg.source == "synthetic":
        rows = synthetic_rows(cfg, split)
        return ray.data.from_items(rows, override_num_blocks=num_blocks(len(rows))).map_batches(
            _synthetic_frame,
            batch_format="pandas",
            fn_kwargs={"schema": qa_schema("question", "answer"), "split": split},
        )
    assert path is not None
    if cfg.source == "jsonl":
        kw: dict[str, Any] = {"schema": schema, "max_bytes": cfg.max_row_bytes}
        return _files(path, "jsonl").map_batches(_jsonl_file, batch_size=1, batch_format="numpy", fn_kwargs=kw)
    if cfg.source == "parquet":
        return _files(path, "parquet").map_batches(
            _parquet_file, batch_size=1, batch_format="numpy", fn_kwargs={"schema": schema}
        )
    hf = load_hf(cfg, path, split)
    hf = hf.add_column("__row", list(range(1, len(hf) + 1)))
    return (
        ray.data.from_huggingface(hf)
        .repartition(num_blocks(len(hf)))
        .map_batches(_hf_frame, batch_format="pandas", fn_kwargs={"schema": schema, "name": f"{path}[{split}]"})
    )


def load_hf(cfg: DataConfig, path: str, split: str) -> Any:
    """``datasets.load_dataset`` of ``path``; a dataset that can't be had here is a config error."""
    import datasets

    from raypost.config.base import ConfigError

    try:
        return datasets.load_dataset(path, name=cfg.hf_config, split=split)
    except Exception as err:  # noqa: BLE001 - datasets raises many kinds for "not reachable"
        raise ConfigError(
            f"data.path: the HF dataset '{path}' (config {cfg.hf_config!r}, split '{split}') can't be loaded "
            f"here ({type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''}). Without the "
            "hub, download it where the hub is reachable and set HF_DATASETS_OFFLINE=1 here, or give a "
            "local file: data.source=jsonl|parquet and data.path=<file>"
        ) from None


def synthetic_rows(cfg: DataConfig, split: str) -> list[dict[str, Any]]:
    """The synthetic task's train or eval problems; eval never repeats a train question and has
    no demos. Every row has ``demo`` and ``prior_turns`` keys ('' when it has none) so the rows
    share columns."""
    s = cfg.synthetic
    train = synthetic.generate(
        s.num_train,
        s.seed,
        s.max_operand,
        s.two_step_fraction,
        prefix="train",
        guess_fraction=s.guess_fraction,
        task=s.task,
        tool_demos=s.tool_demos,
        tool_answer_share=s.tool_answer_share,
    )
    if split == "train":
        return [{"demo": "", "prior_turns": "", **r} for r in train]
    seen = {r["question"] for r in train}
    pool = synthetic.generate(
        s.num_eval * 2, s.seed + 1, s.max_operand, s.two_step_fraction, prefix="eval", task=s.task
    )
    return [{**r, "demo": "", "prior_turns": ""} for r in pool if r["question"] not in seen][: s.num_eval]


def check_inputs(cfg: DataConfig) -> None:
    """Before Ray starts: local files exist, and an HF dataset can be loaded; else a ConfigError
    naming the field and the fix."""
    from raypost.config.base import ConfigError

    for field, path in (("data.path", cfg.path), ("data.eval_path", cfg.eval_path)):
        if path is None or cfg.source == "synthetic" or "://" in path:
            continue
        if cfg.source in EXTENSIONS and not Path(path).exists():
            raise ConfigError(f"{field}: '{path}' does not exist; give a file or folder that does")
    if cfg.source == "hf" and cfg.path is not None and not Path(cfg.path).exists():
        load_hf(cfg, cfg.path, cfg.hf_split)  # cached by datasets: the data phase reads it again fast
