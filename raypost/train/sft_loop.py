"""The SFT learner: one Ray Train worker's loop (DeepSpeed, completion-only CE loss).

Data order is global and deterministic (see ``data.preprocess.sft_rows``): every worker
reads the same ordered rows and takes its own slice of each global batch, so the
controller's ``cursor`` (global batches consumed) makes resume exact.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import ray.train
import torch

from raypost.config import SFTConfig
from raypost.train import checkpointing
from raypost.train.batches import collate, micro_batches, rank_slice, to_device
from raypost.train.engine import all_sum, backward_share, set_hyperparams, setup_learner
from raypost.train.objectives import Objective, cross_entropy, objective_for, objective_tokens
from raypost.utils.metrics import MetricsLogger, Progress

log = logging.getLogger("raypost.sft")


def _forward_loss(engine: Any, batch: dict[str, torch.Tensor],
                  objective: Objective = cross_entropy) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    batch = to_device(batch, engine.device)
    out = engine(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                 position_ids=batch["position_ids"], use_cache=False)
    return objective(out.logits, batch)


def eval_loss(engine: Any, pad_id: int, rank: int, world: int, mb: int) -> float:
    """Token-mean CE over the held-out rows (each rank a slice, summed across ranks)."""
    shard = ray.train.get_dataset_shard("eval")
    if shard is None:
        return float("nan")
    engine.eval()
    loss_sum, count = 0.0, 0.0
    with torch.no_grad():
        for batch in shard.iter_batches(batch_size=mb * world, batch_format="numpy"):
            rows = rank_slice(batch, rank, world)
            if not rows:
                continue
            s, n, _ = _forward_loss(engine, collate(rows, pad_id))
            loss_sum, count = loss_sum + s.item(), count + n.item()
    engine.train()
    loss_sum, count = all_sum(loss_sum, count)
    return loss_sum / max(count, 1.0)


def train_step(engine: Any, rows: list[dict[str, Any]], pad_id: int, micro: int,
               objective: Objective = cross_entropy) -> tuple[float, int, dict[str, float]]:
    """One optimizer step over this rank's rows of the global batch.

    The loss is the objective's sum over supervised tokens divided by the supervised tokens of
    the whole global batch (all ranks), so it is the global token mean however the batch is
    split. Returns (this rank's share of that loss: the shares add up to it over ranks, real
    tokens seen, the objective's metrics averaged over micro-batches)."""
    (norm,) = all_sum(float(objective_tokens(objective, rows)))
    share, tokens, extra, count = 0.0, 0, {}, 0
    for mb in micro_batches(rows, micro):
        s, _, metrics = _forward_loss(engine, collate(mb, pad_id), objective)
        loss = s / max(norm, 1.0)
        backward_share(engine, loss)
        engine.step()
        share += loss.item()
        tokens += sum(len(r["input_ids"]) for r in mb)
        extra, count = {k: extra.get(k, 0.0) + v for k, v in metrics.items()}, count + 1
    return share, tokens, {k: v / max(1, count) for k, v in extra.items()}


def sft_loop(config: dict[str, Any]) -> None:
    """Ray Train entry: ``config`` = {cfg: SFTConfig dict, model_path, run_dir, total_steps,
    optional kd: KDParams fields (offline distillation; rows then carry teacher columns),
    optional start_from: a checkpoint folder to start from when this run has none, optional
    stop_at: a step to stop at (after its checkpoint) before total_steps (PBT segments)}."""
    cfg = SFTConfig.model_validate(config["cfg"])
    total = int(config["total_steps"])
    objective = objective_for(config.get("kd"))
    rank, world, tokenizer, engine = setup_learner(cfg, config["model_path"], cfg.optim, total)
    state = checkpointing.restore(engine, config.get("start_from"))
    set_hyperparams(engine, cfg.optim)
    stop_at = min(total, int(config.get("stop_at") or total))
    if rank == 0:
        checkpointing.rewind_on_start(config["run_dir"], state, "sft")
    logger = MetricsLogger(config["run_dir"], rank == 0, cfg.run.wandb_mode, run_name=cfg.run.name,
                           config=config["cfg"])
    progress = Progress(total, state.step, "sft")
    global_batch = cfg.optim.micro_batch_size * cfg.optim.grad_accum * world
    shard = ray.train.get_dataset_shard("train")
    window_tokens, window_steps, window_t0, metrics = 0.0, 0, time.time(), {}
    for index, batch in enumerate(shard.iter_batches(batch_size=global_batch, batch_format="numpy", drop_last=True)):
        if index == 0 and rank == 0:
            log.info("first batch after %.1fs of data start-up", time.time() - window_t0)
        if index < state.cursor:
            continue  # consumed before the last checkpoint
        if state.step >= total:
            break
        loss, tokens, extra = train_step(engine, rank_slice(batch, rank, world), tokenizer.pad_token_id,
                                         cfg.optim.micro_batch_size, objective)
        state.step, state.cursor = state.step + 1, index + 1
        if rank == 0:
            # packed rows carry "id1,id2,...": log every example
            ids = [i for packed in batch["sample_ids"] for i in str(packed).split(",")]
            checkpointing.log_trained(config["run_dir"], state.step, ids)
        window_tokens, window_steps = window_tokens + tokens, window_steps + 1
        last = state.step >= total
        logged = state.step % cfg.run.log_every == 0 or last
        if logged:
            loss_g, tok_g = all_sum(loss, window_tokens)
            dt = time.time() - window_t0
            metrics = {"phase": "sft", "loss": loss_g, "tokens_per_s": tok_g / max(dt, 1e-9),
                       "step_s": dt / window_steps, "lr": engine.get_lr()[0], **extra}  # extra: rank 0's objective
            window_tokens, window_steps, window_t0 = 0.0, 0, time.time()
        if cfg.train.eval_loss and (last or (cfg.train.eval_every and state.step % cfg.train.eval_every == 0)):
            # its own cadence: a checkpoint's report carries the eval loss even between log lines
            metrics["eval_loss"] = eval_loss(engine, tokenizer.pad_token_id, rank, world, cfg.optim.micro_batch_size)
            if not logged:
                logger.log({"phase": "sft", "eval_loss": metrics["eval_loss"]}, state.step)
        if logged:
            logger.log(metrics, state.step)
            if rank == 0:
                log.info(progress.line(state.step, {k: v for k, v in metrics.items() if k != "phase"}))
        if last or state.step == stop_at or state.step % cfg.run.checkpoint_every == 0:
            exporter = checkpointing.hf_exporter(engine, cfg.deepspeed.zero_stage, tokenizer, rank) if last else None
            checkpointing.save_and_report(engine, state, {"step": state.step, **metrics}, rank, exporter,
                                          config["run_dir"])
        if last or state.step >= stop_at:
            break
    logger.finish()
