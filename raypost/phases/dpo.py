"""Phases of the DPO job: preference pairs with Ray Data (built from question/answer rows or
given), the policy (the tiny model built from their text, or ``model.path``), and DPO on Ray
Train + DeepSpeed."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray.data

from raypost.config.dpo import DPOConfig
from raypost.data import preprocess
from raypost.data.preference import TokenizeChatPairs, build_pairs, pair_schema
from raypost.phases.data import base_model
from raypost.train import checkpointing
from raypost.train.dpo_loop import dpo_loop
from raypost.train.loop import LoopConfig
from raypost.train.trainer import fit, learner_request, plan_steps
from raypost.utils.cluster import check_resources

log = logging.getLogger("raypost")
TEXT_COLUMNS = ["prompt", "chosen", "rejected", "kind"]


def read_pairs(cfg: DPOConfig, run_dir: Path) -> tuple[str, ray.data.Dataset, ray.data.Dataset]:
    """The policy's path and both splits' pair rows (untokenized). Built pairs come from
    question/answer rows, whose text also builds the tiny model when ``model.path`` is unset."""
    p = cfg.pairs
    if not p.build:
        train, evals = preprocess.read_splits(cfg.data, pair_schema(p.prompt_field, p.chosen_field, p.rejected_field))
        if cfg.model.path is None:
            raise ValueError("pairs.build=false needs model.path: the tiny model is built from question/answer rows")
        return cfg.model.path, train, evals
    rows = preprocess.read_splits(cfg.data)
    model_path = base_model(cfg.model, rows[0], run_dir)
    kwargs = {"mismatch_fraction": p.mismatch_fraction, "seed": p.seed}
    train, evals = (s.map_batches(build_pairs, batch_format="pandas", batch_size=4096, fn_kwargs=kwargs) for s in rows)
    return model_path, train, evals


@dataclass
class DPOData:
    """The policy's path, the tokenized train and held-out pairs, the counts; with
    ``policy_pairs``, also the held-out questions whose greedy accuracy is measured."""

    model_path: str
    train: ray.data.Dataset
    eval: ray.data.Dataset
    counts: dict[str, Any]
    questions: list[dict[str, Any]] = field(default_factory=list)
    accuracy_before: dict[str, Any] | None = None


def prepare(cfg: DPOConfig, run_dir: Path) -> DPOData:
    """The pairs (given, built, or sampled from the policy) and the policy; rejects with their
    reasons go to ``run_dir/rejects.jsonl``."""
    if cfg.policy_pairs.enabled:
        return sampled_pairs(cfg, run_dir)
    model_path, *splits = read_pairs(cfg, run_dir)
    rejects = run_dir / "rejects.jsonl"
    rejects.unlink(missing_ok=True)
    d = cfg.data
    kwargs = {"tokenizer_path": model_path, "max_seq_len": d.max_seq_len}
    kwargs |= {"system_prompt": d.system_prompt, "template": d.prompt_template}
    out, counts = [], {}
    for name, ds in zip(("train", "eval"), splits):
        good, c = preprocess.split_rejects(
            preprocess.map_light(ds, TokenizeChatPairs, **kwargs).materialize(), name, rejects
        )
        out.append(with_reference(cfg, model_path, good.drop_columns(TEXT_COLUMNS)))
        counts[name] = c.as_dict()
    return DPOData(model_path, out[0], out[1], counts)


def sampled_pairs(cfg: DPOConfig, run_dir: Path) -> DPOData:
    """``policy_pairs``: the questions tokenized as GRPO's prompts, then pairs of the policy's
    own samples (``phases.policy_pairs``), as sampled."""
    from raypost.phases import data as data_phase
    from raypost.phases import policy_pairs

    model_path, data = data_phase.prepare(cfg.data, cfg.model, run_dir)
    train, evals, summary = policy_pairs.build(cfg, model_path, data, run_dir)
    cols = ("id", "prompt_ids", "chosen_ids", "rejected_ids")
    splits = [
        with_reference(cfg, model_path, ray.data.from_items([{c: r[c] for c in cols} for r in rows]))
        for rows in (train, evals)
    ]
    counts = {**data.counts, "policy_pairs": {k: v for k, v in summary.items() if k != "heldout_before"}}
    questions = data.eval_rows(cfg.data.max_eval_samples)
    return DPOData(model_path, splits[0], splits[1], counts, questions, summary["heldout_before"])


def with_reference(cfg: DPOConfig, model_path: str, pairs: ray.data.Dataset) -> ray.data.Dataset:
    """``pairs`` with the reference's log-probs (``dpo.reference: precomputed``), from one actor
    holding the starting policy on a learner worker's resources; as they are otherwise."""
    from raypost.algos.preference import NEEDS_REFERENCE

    if cfg.dpo.reference != "precomputed" or not NEEDS_REFERENCE[cfg.dpo.loss]:
        return pairs
    from raypost.train.reference import ReferenceLogps

    t0 = time.time()
    scored = pairs.map_batches(
        ReferenceLogps,
        batch_format="pandas",
        batch_size=256,
        fn_constructor_kwargs={
            "model_path": model_path,
            "precision": cfg.deepspeed.precision,
            "micro_batch": cfg.optim.micro_batch_size,
        },
        num_cpus=cfg.resources.cpus_per_worker,
        num_gpus=cfg.resources.gpus_per_worker,
        **preprocess.actor_pool(1),
    ).materialize()
    log.info("reference log-probs of %d pairs precomputed in %.1f s", scored.count(), time.time() - t0)
    return scored


def train(
    cfg: DPOConfig, model_path: str, train_ds: ray.data.Dataset, eval_ds: ray.data.Dataset, run_dir: Path
) -> tuple[str, float, dict[str, Any]]:
    """DPO on Ray Train; returns (HF export path, wall seconds, last metrics)."""
    check_resources({"resources (learner)": learner_request(cfg.resources)})
    total = plan_steps(cfg.dpo.epochs * train_ds.count(), cfg.optim, cfg.resources, cfg.dpo.max_steps, "pairs")
    order = preprocess.epoch_order(train_ds, cfg.dpo.epochs, cfg.run.seed).materialize()
    held_out = eval_ds.limit(cfg.dpo.max_eval_pairs).materialize()
    log.info(
        "dpo (%s): %d steps on %d workers, %d held-out pairs",
        cfg.dpo.loss,
        total,
        cfg.resources.num_workers,
        held_out.count(),
    )
    t0 = time.time()
    result = fit(
        dpo_loop,
        LoopConfig(cfg=cfg.model_dump(mode="json"), model_path=model_path, run_dir=str(run_dir), total_steps=total),
        cfg.resources,
        cfg.run,
        {"train": order, "eval": held_out},
    )
    if result.error is not None:
        raise result.error
    return str(Path(result.checkpoint.path) / checkpointing.HF_DIR), time.time() - t0, dict(result.metrics or {})
