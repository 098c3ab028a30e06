"""The PPO step: the critic's values of this rank's sequences, GAE advantages per token
(whitened over the whole global batch), the policy's clipped update on them (GRPO's step with a
per-token advantage), then ``critic.epochs`` updates of the critic toward the returns with the
clipped value loss. During ``critic.warmup_steps`` only the critic learns.

Every normalizer is the global batch's (``BatchCounts`` and ``Moments`` summed over ranks), so
the gradients do not depend on how the batch is split (tests/integration/test_learner_equivalence.py).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from raypost.algos import BatchCounts, Moments, explained_variance, gae, terminal_rewards, value_loss, whiten
from raypost.config.ppo import PPOConfig
from raypost.rl.records import LearnerBatch, Sequence
from raypost.rl.tensors import collate, completion_columns, loss_tokens
from raypost.train.batches import micro_batches
from raypost.train.collectives import all_sum
from raypost.train.steps import accumulate, mean_metrics
from raypost.train.steps import grpo as policy_step


def values_of(critic: Any, b: LearnerBatch) -> torch.Tensor:
    """[N, T-1] the critic's value of the state before each target token (fp32)."""
    out = critic(input_ids=b.input_ids, attention_mask=b.attention_mask).logits  # [N, T, 1]
    return out[:, :-1, 0].float()


def _moments(x: Moments) -> Moments:
    return Moments(*all_sum(x.n, x.total, x.squares))


@torch.no_grad()
def estimate(critic: Any, rows: list[Sequence], cfg: PPOConfig, pad_id: int) -> dict[str, float]:
    """Fill each row's ``values``, ``returns`` and (whitened) ``token_adv`` from the critic as it
    is before this step's updates. Returns the batch's value metrics (global over ranks)."""
    c = cfg.critic
    adv_m, ret_m, res_m, val_m = [], [], [], []
    for mb in micro_batches(rows, cfg.optim.micro_batch_size):
        b = collate(mb, pad_id).to(critic.device)
        values = values_of(critic, b)
        rewards = terminal_rewards(torch.tensor([r.reward for r in mb], device=values.device), b.mask)
        adv, returns = gae(values, rewards, b.mask, c.gamma, c.lam)
        for r, a, ret, v in zip(mb, *(completion_columns(x, mb) for x in (adv, returns, values))):
            r.token_adv, r.returns, r.values = a, ret, v
        adv_m.append(Moments.of(adv, b.mask))
        ret_m.append(Moments.of(returns, b.mask))
        res_m.append(Moments.of(returns - values, b.mask))
        val_m.append(Moments.of(values, b.mask))
    adv_all, ret_all, res_all, val_all = (_moments(_add(m)) for m in (adv_m, ret_m, res_m, val_m))
    if c.whiten_advantages:
        for r in rows:
            mask = torch.tensor(r.mask if r.mask is not None else [1] * r.completion_len, dtype=torch.float32)
            r.token_adv = whiten(torch.tensor(r.token_adv), mask, adv_all).tolist()
    return {
        "explained_variance": explained_variance(res_all, ret_all),
        "values_mean": val_all.mean,
        "returns_mean": ret_all.mean,
        "advantages_std": adv_all.var**0.5,
    }


def _add(parts: list[Moments]) -> Moments:
    return Moments(sum(m.n for m in parts), sum(m.total for m in parts), sum(m.squares for m in parts))


def learn_critic(critic: Any, rows: list[Sequence], cfg: PPOConfig, pad_id: int) -> dict[str, float]:
    """``critic.epochs`` optimizer steps of the critic on this rank's rows (``estimate`` first)."""
    counts = BatchCounts(*all_sum(float(len(rows)), float(loss_tokens(rows))))

    def loss_of(mb: list[Sequence]) -> tuple[torch.Tensor, dict[str, float]]:
        b = collate(mb, pad_id).to(critic.device)
        return value_loss(values_of(critic, b), b.old_values, b.returns, b.mask, cfg.critic.value_clip, counts)

    t0, out = time.perf_counter(), {}
    for epoch in range(cfg.critic.epochs):
        share, per_chunk = accumulate(critic, list(micro_batches(rows, cfg.optim.micro_batch_size)), loss_of)
        if epoch == 0:  # the loss of the critic this batch's targets were computed with
            (out["value_loss"],) = all_sum(share)
        out["vf_clip_frac"] = mean_metrics(per_chunk)["vf_clip_frac"]
    out["critic_step_s"] = time.perf_counter() - t0
    return out


def learn(
    engine: Any, critic: Any, ref: Any, rows: list[Sequence], cfg: PPOConfig, pad_id: int, policy_on: bool
) -> dict[str, float]:
    """One PPO step on this rank's rows: values and advantages, the policy's update (unless the
    critic is still warming up, ``policy_on`` False), the critic's updates."""
    metrics = estimate(critic, rows, cfg, pad_id)
    if policy_on:
        metrics.update(policy_step.learn(engine, ref, rows, cfg, pad_id))
    metrics.update(learn_critic(critic, rows, cfg, pad_id))
    return metrics
