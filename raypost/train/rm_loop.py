"""The reward-model learner: one Ray Train worker's loop (DeepSpeed, Bradley-Terry loss).

Pairs come in one deterministic global order; each worker takes its own slice of each
global batch, so the controller's cursor (global batches consumed) makes resume exact.
Chosen and rejected encodings of a micro-batch go through the model in one forward pass.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import ray.train
import torch

from raypost.algos.pairwise import bradley_terry_loss
from raypost.config.reward_model import RewardModelConfig
from raypost.train import checkpointing
from raypost.train.batches import micro_batches, rank_slice, to_device
from raypost.train.engine import all_sum, backward_share, setup_learner
from raypost.utils.metrics import MetricsLogger, Progress

log = logging.getLogger("raypost.rm")


def _load(path: str, model_cfg: Any, precision: str) -> torch.nn.Module:
    from raypost.models.hf import load_sequence_classifier

    model = load_sequence_classifier(path, precision)
    if model_cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def pair_inputs(rows: list[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    """[2B, T] right-padded inputs: the B chosen encodings, then the B rejected ones."""
    seqs = [r["chosen_ids"] for r in rows] + [r["rejected_ids"] for r in rows]
    types = [r["chosen_types"] for r in rows] + [r["rejected_types"] for r in rows]
    t = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), t), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), t), dtype=torch.long)
    tt = torch.zeros((len(seqs), t), dtype=torch.long)
    for i, (s, ty) in enumerate(zip(seqs, types)):
        ids[i, :len(s)] = torch.from_numpy(np.array(s, dtype=np.int64))
        mask[i, :len(s)] = 1
        if len(ty):
            tt[i, :len(ty)] = torch.from_numpy(np.array(ty, dtype=np.int64))
    out = {"input_ids": ids, "attention_mask": mask}
    if any(len(ty) for ty in types):
        out["token_type_ids"] = tt
    return out


def scores(engine: Any, rows: list[dict[str, Any]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen [B], rejected [B]) scores of ``rows``."""
    logits = engine(**to_device(pair_inputs(rows, pad_id), engine.device)).logits[:, 0].float()
    return logits[:len(rows)], logits[len(rows):]


def _all_mean(values: list[float], counts: float) -> list[float]:
    *sums, total = all_sum(*(v * counts for v in values), counts)
    return [v / max(total, 1.0) for v in sums]


def eval_accuracy(engine: Any, pad_id: int, rank: int, world: int, mb: int) -> float:
    """Held-out pairwise accuracy: share of pairs with score(chosen) > score(rejected)."""
    shard = ray.train.get_dataset_shard("eval")
    engine.eval()
    right, seen = 0.0, 0.0
    with torch.no_grad():
        for batch in shard.iter_batches(batch_size=mb * world, batch_format="numpy"):
            rows = rank_slice(batch, rank, world)
            if rows:
                c, r = scores(engine, rows, pad_id)
                right, seen = right + (c > r).sum().item(), seen + len(rows)
    engine.train()
    right, seen = all_sum(right, seen)
    return right / max(seen, 1.0)


def train_step(engine: Any, rows: list[dict[str, Any]], cfg: RewardModelConfig, pad_id: int) -> dict[str, float]:
    """One optimizer step over this rank's pairs of the global batch (micro-batches
    accumulate); the loss is the mean over the global batch's pairs, counted over all ranks.
    Returns the metrics as means over the global batch."""
    (norm,) = all_sum(float(len(rows)))
    sums: dict[str, float] = {}
    for mb in micro_batches(rows, cfg.optim.micro_batch_size):
        c, r = scores(engine, mb, pad_id)
        margin = torch.full_like(c, cfg.train.margin) if cfg.train.margin else None
        loss, m = bradley_terry_loss(c, r, margin, cfg.train.center_coef, norm)
        backward_share(engine, loss)
        engine.step()
        for k, v in m.items():
            sums[k] = sums.get(k, 0.0) + v * len(mb)
    keys = sorted(sums)
    return dict(zip(keys, _all_mean([sums[k] / len(rows) for k in keys], float(len(rows)))))


def rm_loop(config: dict[str, Any]) -> None:
    """Ray Train entry: ``config`` = {cfg: RewardModelConfig dict, model_path, run_dir, total_steps}."""
    cfg = RewardModelConfig.model_validate(config["cfg"])
    total = int(config["total_steps"])
    rank, world, tok, engine = setup_learner(cfg, config["model_path"], cfg.optim, total, load=_load)
    state = checkpointing.restore(engine)
    logger = MetricsLogger(config["run_dir"], rank == 0, cfg.run.wandb_mode, run_name=cfg.run.name,
                           config=config["cfg"])
    progress = Progress(total, state.step, "rm")
    global_batch = cfg.optim.micro_batch_size * cfg.optim.grad_accum * world
    batches = ray.train.get_dataset_shard("train").iter_batches(batch_size=global_batch, batch_format="numpy",
                                                               drop_last=True)
    for index, batch in enumerate(batches):
        if index < state.cursor:
            continue  # consumed before the last checkpoint
        metrics = {"phase": "rm", **train_step(engine, rank_slice(batch, rank, world), cfg, tok.pad_token_id),
                   "lr": engine.get_lr()[0]}
        state.step, state.cursor = state.step + 1, index + 1
        last = state.step >= total
        if last or (cfg.train.eval_every and state.step % cfg.train.eval_every == 0):
            metrics["eval_accuracy"] = eval_accuracy(engine, tok.pad_token_id, rank, world, cfg.optim.micro_batch_size)
        if last or state.step % cfg.run.log_every == 0:
            logger.log(metrics, state.step)
            if rank == 0:
                log.info(progress.line(state.step, {k: v for k, v in metrics.items() if k != "phase"}))
        if last or state.step % cfg.run.checkpoint_every == 0:
            exporter = checkpointing.hf_exporter(engine, cfg.deepspeed.zero_stage, tok, rank) if last else None
            checkpointing.save_and_report(engine, state, {"step": state.step, **metrics}, rank, exporter,
                                          config["run_dir"])
        if last:
            break
    logger.finish()
