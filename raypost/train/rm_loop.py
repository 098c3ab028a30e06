"""The reward-model learner: one Ray Train worker's loop (DeepSpeed, Bradley-Terry loss).

Pairs come in one deterministic global order; each worker takes its own slice of each
global batch, so the controller's cursor (global batches consumed) makes resume exact.
The step itself is ``train.steps.rm``; the loop is the one skeleton (``train.loop``).
"""

from __future__ import annotations

import logging
from typing import Any

import ray.train
import torch

from raypost.config.reward_model import RewardModelConfig
from raypost.train import checkpointing
from raypost.train.batches import rank_slice
from raypost.train.collectives import all_sum
from raypost.train.engine import setup_learner
from raypost.train.loop import Learner, LoopConfig, Worker, run_learner, take_from
from raypost.train.steps.rm import load_reward_model, scores, train_step

log = logging.getLogger("raypost.rm")


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


def _pair_ids(index: int, batch: dict[str, Any]) -> list[str]:
    if "id" in batch:
        return [str(i) for i in batch["id"]]
    return [f"b{index}:{i}" for i in range(len(next(iter(batch.values()))))]


def rm_loop(config: dict[str, Any]) -> None:
    """Ray Train entry: ``config["loop"]``, a ``LoopConfig``."""
    lc = LoopConfig.of(config)
    cfg = RewardModelConfig.model_validate(lc.cfg)
    total = lc.total_steps
    rank, world, tok, engine = setup_learner(cfg, lc.model_path, cfg.optim, total, load=load_reward_model)
    state = checkpointing.restore(engine)
    pad, micro, every = tok.pad_token_id, cfg.optim.micro_batch_size, cfg.train.eval_every
    batches = ray.train.get_dataset_shard("train").iter_batches(
        batch_size=micro * cfg.optim.grad_accum * world, batch_format="numpy", drop_last=True
    )

    def after(st: checkpointing.ControllerState, metrics: dict[str, float], t0: float) -> dict[str, float]:
        if st.step >= total or (every and st.step % every == 0):
            return {"eval_accuracy": eval_accuracy(engine, pad, rank, world, micro)}
        return {}

    learner = Learner(
        phase="rm",
        label="rm",
        steps=total,
        take=take_from(batches, state, rank, world, _pair_ids),
        learn=lambda rows: {**train_step(engine, rows, cfg, pad), "lr": engine.get_lr()[0]},
        after=after,
        every_step=False,
        always=("eval_accuracy",),
        shown=("loss", "accuracy", "margin", "eval_accuracy", "step_s", "lr"),
    )
    run_learner(
        learner,
        Worker(
            rank=rank,
            engine=engine,
            tokenizer=tok,
            zero_stage=cfg.deepspeed.zero_stage,
            run_dir=lc.run_dir,
            run=cfg.run,
            config=lc.cfg,
        ),
        state,
    )
