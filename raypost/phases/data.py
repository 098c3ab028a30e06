"""Phase: preprocess the data with Ray Data and build (or load) the model it trains."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray.data

from raypost.config import DataConfig, ModelConfig
from raypost.data import preprocess
from raypost.models import named

log = logging.getLogger("raypost")


@dataclass
class PreparedData:
    """Tokenized good rows of both splits, and what was rejected."""

    train: ray.data.Dataset
    eval: ray.data.Dataset
    counts: dict[str, Any] = field(default_factory=dict)

    def eval_rows(self, limit: int) -> list[dict[str, Any]]:
        return [
            {"id": r["id"], "prompt_ids": list(r["prompt_ids"]), "question": r["question"], "answer": r["answer"]}
            for r in self.eval.take(limit)
        ]


def start_run(cfg: Any, verbose: bool = True) -> Path:
    """Driver start of any pipeline: logging, Ray (joined or local), the run folder with the
    validated config written into it. ``cfg`` has a ``run`` section. Not ``verbose``: Ray,
    Serve and vLLM lines go to ``<run>/logs.txt``, raypost's progress lines to the terminal."""
    from raypost.config import dump_yaml
    from raypost.train.trainer import run_dir as make_run_dir
    from raypost.utils import storage
    from raypost.utils.cluster import init_ray
    from raypost.utils.logs import quiet_driver, quiet_workers, setup_logging
    from raypost.utils.runlock import hold_run

    setup_logging()
    check_data_inputs(cfg)
    run_dir = make_run_dir(cfg.run)
    run_dir.mkdir(parents=True, exist_ok=True)
    hold_run(run_dir, cfg.run.lock_wait_s)  # one driver per run folder, for this process's life
    logs = run_dir / "logs.txt"
    if not verbose:
        quiet_driver(logs)
    init_ray(cfg.run.ray_address)
    if not verbose:
        quiet_workers(logs)
        log.info("run folder %s; library logs in %s (--verbose shows them here)", run_dir, logs)
    fetched = storage.pull(run_dir)  # a run stored at a URI resumes from what it holds, on any machine
    if fetched:
        log.info("fetched %d files of %s from %s into %s", fetched, cfg.run.name, cfg.run.storage_path, run_dir)
    dump_yaml(cfg, run_dir / "config.yaml")
    return run_dir


def data_sections(cfg: Any) -> list[DataConfig]:
    """Every ``DataConfig`` in ``cfg``, at any depth (a pipeline's data, a teacher's data)."""
    from pydantic import BaseModel

    if isinstance(cfg, DataConfig):
        return [cfg]
    if not isinstance(cfg, BaseModel):
        return []
    return [d for name in type(cfg).model_fields for d in data_sections(getattr(cfg, name))]


def check_data_inputs(cfg: Any) -> None:
    """Before Ray starts: every data section's files exist and its HF dataset loads (ConfigError)."""
    from raypost.data.sources import check_inputs

    for section in data_sections(cfg):
        check_inputs(section)


def base_model(cfg: ModelConfig, train_rows: ray.data.Dataset, out_dir: Path) -> str:
    """``cfg.path`` as given, or the tiny model built from the training text (cached in out_dir).
    A raypost name stays a name (each node resolves it into its own cache); it is converted here
    first, once, so that the tokenizer actors and learners of this node find it ready."""
    if cfg.path is not None:
        if named.is_named(cfg.path):
            log.info("%s: %s at %s", cfg.path, named.NAMED[cfg.path].note, named.resolve(cfg.path))
        return cfg.path
    from raypost.models.tiny import build_tiny_model

    good = train_rows.filter(lambda r: r["reject"] == "").take(20_000)
    texts = [r["question"] for r in good] + [r["solution"] for r in good]
    path = build_tiny_model(cfg.tiny, texts, out_dir / "base_model")
    log.info("tiny model ready at %s", path)
    return str(path)


def prepare(data_cfg: DataConfig, model_cfg: ModelConfig, run_dir: Path) -> tuple[str, PreparedData]:
    """Read + validate both splits, build/load the model, tokenize; rejects go to run_dir."""
    train_rows, eval_rows = preprocess.read_splits(data_cfg)
    model_path = base_model(model_cfg, train_rows, run_dir)
    rejects = run_dir / "rejects.jsonl"
    rejects.unlink(missing_ok=True)
    train, train_counts = preprocess.split_rejects(
        preprocess.tokenize(train_rows, model_path, data_cfg), "train", rejects
    )
    evals, eval_counts = preprocess.split_rejects(preprocess.tokenize(eval_rows, model_path, data_cfg), "eval", rejects)
    return model_path, PreparedData(train, evals, {"train": train_counts.as_dict(), "eval": eval_counts.as_dict()})
