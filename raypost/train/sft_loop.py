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
from raypost.data.collate import collate
from raypost.train import checkpointing
from raypost.train.batches import rank_slice
from raypost.train.collectives import all_sum
from raypost.train.engine import set_hyperparams, setup_learner
from raypost.train.loop import Learner, LoopConfig, Worker, run_learner, take_from
from raypost.train.objectives import objective_for
from raypost.train.steps.sft import forward_loss, train_step

log = logging.getLogger("raypost.sft")


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
            s, n, _ = forward_loss(engine, collate(rows, pad_id))
            loss_sum, count = loss_sum + s.item(), count + n.item()
    engine.train()
    loss_sum, count = all_sum(loss_sum, count)
    return loss_sum / max(count, 1.0)


class _Window:
    """Tokens and steps since the last progress line: its tokens/s and seconds a step."""

    def __init__(self) -> None:
        self.tokens, self.steps, self.t0 = 0.0, 0, time.time()

    def add(self, tokens: float) -> None:
        self.tokens, self.steps = self.tokens + tokens, self.steps + 1

    def flush(self) -> dict[str, float]:
        dt = time.time() - self.t0
        out = {"tokens_per_s": self.tokens / max(dt, 1e-9), "step_s": dt / max(1, self.steps)}
        self.tokens, self.steps, self.t0 = 0.0, 0, time.time()
        return out


def _packed_ids(index: int, batch: dict[str, Any]) -> list[str]:
    return [i for packed in batch["sample_ids"] for i in str(packed).split(",")]  # "id1,id2,..." per packed row


def sft_loop(config: dict[str, Any]) -> None:
    """Ray Train entry: ``config["loop"]``, a ``LoopConfig`` (with ``kd`` for offline
    distillation, ``start_from`` and ``stop_at`` for PBT segments)."""
    lc = LoopConfig.of(config)
    cfg = SFTConfig.model_validate(lc.cfg)
    total = lc.total_steps
    objective = objective_for(lc.kd)
    rank, world, tokenizer, engine = setup_learner(cfg, lc.model_path, cfg.optim, total)
    state = checkpointing.restore(engine, lc.start_from)
    set_hyperparams(engine, cfg.optim)
    stop_at = min(total, lc.stop_at or total)
    pad, micro, every = tokenizer.pad_token_id, cfg.optim.micro_batch_size, cfg.train.eval_every
    window = _Window()
    shard = ray.train.get_dataset_shard("train")
    batches = shard.iter_batches(batch_size=micro * cfg.optim.grad_accum * world, batch_format="numpy", drop_last=True)

    def started() -> None:
        if rank == 0:
            log.info("first batch after %.1fs of data start-up", time.time() - window.t0)

    def learn(rows: list[dict[str, Any]]) -> dict[str, float]:
        share, tokens, extra = train_step(engine, rows, pad, micro, objective)
        loss, tokens = all_sum(share, tokens)
        window.add(tokens)
        return {"loss": loss, "lr": engine.get_lr()[0], **extra}  # extra: rank 0's objective metrics

    def after(st: checkpointing.ControllerState, metrics: dict[str, float], t0: float) -> dict[str, float]:
        last = st.step >= total
        out = window.flush() if last or st.step % cfg.run.log_every == 0 else {}
        if cfg.train.eval_loss and (last or (every and st.step % every == 0)):
            out["eval_loss"] = eval_loss(engine, pad, rank, world, micro)
        return out

    learner = Learner(
        phase="sft",
        label="sft",
        steps=total,
        take=take_from(batches, state, rank, world, _packed_ids, started),
        learn=learn,
        after=after,
        every_step=False,
        always=("eval_loss",),
        shown=("loss", "kd", "ce", "eval_loss", "tokens_per_s", "step_s", "lr"),
        stop_at=stop_at if stop_at < total else None,
    )
    run_learner(
        learner,
        Worker(
            rank=rank,
            engine=engine,
            tokenizer=tokenizer,
            zero_stage=cfg.deepspeed.zero_stage,
            run_dir=lc.run_dir,
            run=cfg.run,
            config=lc.cfg,
        ),
        state,
    )
