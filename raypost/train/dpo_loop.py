"""The DPO learner: one Ray Train worker's loop (DeepSpeed policy, frozen reference).

Pairs come in one deterministic global order; each worker takes its own slice of each global
batch, so the controller's cursor makes resume exact. The reference is the starting policy,
loaded once per worker in the learner's precision (a reference-free loss loads none, and
``dpo.reference: precomputed`` reads its log-probs from the rows instead). The step
is ``train.steps.dpo``; the loop is the one skeleton (``train.loop``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import ray.train
import torch

from raypost.algos import PREFERENCE_LOSSES
from raypost.algos.preference import NEEDS_REFERENCE
from raypost.config.dpo import DPOConfig
from raypost.train import checkpointing
from raypost.train.batches import rank_slice
from raypost.train.collectives import all_sum
from raypost.train.engine import setup_learner
from raypost.train.loop import Learner, LoopConfig, Worker, run_learner, take_from
from raypost.train.steps import dpo as step

START_FILE = "eval_start.json"


def eval_pairs(engine: Any, ref: Any, cfg: DPOConfig, pad_id: int, rank: int, world: int) -> dict[str, float]:
    """Held-out pairs, over every rank's share: the implicit-reward accuracy and margin of the loss
    (0 at the start for DPO and IPO: the policy is the reference), and ``eval_logp_accuracy``,
    the share of pairs whose chosen response the policy itself prefers (a higher mean per-token
    log-prob), which the start and the end can be compared on."""
    shard = ray.train.get_dataset_shard("eval")
    engine.eval()
    sums = [0.0, 0.0, 0.0, 0.0]  # reward accuracy, reward margin, log-prob accuracy, pairs
    with torch.no_grad():
        for batch in shard.iter_batches(batch_size=cfg.optim.micro_batch_size * world, batch_format="numpy"):
            rows = rank_slice(batch, rank, world)
            if not rows:
                continue
            policy = step.pair_logps(engine, rows, pad_id, engine.device)
            reference = step.reference_of(ref, rows, cfg, pad_id, engine.device)
            _, m = PREFERENCE_LOSSES.get_fn(cfg.dpo.loss)(policy, reference, step.params_of(cfg), len(rows))
            prefers = (policy.chosen / policy.chosen_len > policy.rejected / policy.rejected_len).float().mean()
            for i, v in enumerate((m["reward_accuracy"], m["reward_margin"], prefers.item(), 1.0)):
                sums[i] += v * len(rows)
    engine.train()
    acc, margin, logp_acc, seen = all_sum(*sums)
    seen = max(seen, 1.0)
    return {
        "eval_reward_accuracy": acc / seen,
        "eval_reward_margin": margin / seen,
        "eval_logp_accuracy": logp_acc / seen,
    }


def record_start(run_dir: str, metrics: dict[str, float]) -> None:
    """Rank 0: the held-out figures of the starting policy, for the report's before and after."""
    (Path(run_dir) / START_FILE).write_text(json.dumps(metrics))


def _pair_ids(index: int, batch: dict[str, Any]) -> list[str]:
    return [str(i) for i in batch["id"]]


def dpo_loop(config: dict[str, Any]) -> None:
    """Ray Train entry: ``config["loop"]``, a ``LoopConfig``."""
    from raypost.models.hf import load_causal_lm

    lc = LoopConfig.of(config)
    cfg = DPOConfig.model_validate(lc.cfg)
    total, every = lc.total_steps, cfg.dpo.eval_every
    rank, world, tok, engine = setup_learner(cfg, lc.model_path, cfg.optim, total)
    ref = None  # precomputed: the rows carry the reference's log-probs (train.reference)
    if NEEDS_REFERENCE[cfg.dpo.loss] and cfg.dpo.reference == "model":
        ref = load_causal_lm(lc.model_path, cfg.deepspeed.precision).to(engine.device).eval()
    state = checkpointing.restore(engine)
    pad, micro = tok.pad_token_id, cfg.optim.micro_batch_size
    batches = ray.train.get_dataset_shard("train").iter_batches(
        batch_size=micro * cfg.optim.grad_accum * world, batch_format="numpy", drop_last=True
    )

    def start() -> None:
        if state.step == 0:  # every rank: the pass is collective
            before = eval_pairs(engine, ref, cfg, pad, rank, world)
            if rank == 0:
                record_start(lc.run_dir, before)

    def after(st: checkpointing.ControllerState, metrics: dict[str, float], t0: float) -> dict[str, float]:
        if st.step >= total or (every and st.step % every == 0):
            return eval_pairs(engine, ref, cfg, pad, rank, world)
        return {}

    learner = Learner(
        phase="dpo",
        label="dpo",
        steps=total,
        take=take_from(batches, state, rank, world, _pair_ids),
        learn=lambda rows: {**step.learn(engine, ref, rows, cfg, pad), "lr": engine.get_lr()[0]},
        after=after,
        every_step=False,
        always=("eval_reward_accuracy", "eval_reward_margin", "eval_logp_accuracy"),
        shown=("loss", "reward_accuracy", "reward_margin", "eval_logp_accuracy", "step_s", "lr"),
        start=start,
    )
    worker = Worker(
        rank=rank,
        engine=engine,
        tokenizer=tok,
        zero_stage=cfg.deepspeed.zero_stage,
        run_dir=lc.run_dir,
        run=cfg.run,
        config=lc.cfg,
    )
    run_learner(learner, worker, state)
