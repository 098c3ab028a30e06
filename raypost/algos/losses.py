"""Policy losses. Pure functions: tensors in, ``(loss, metrics)`` out.

Shapes: ``logp, old_logp: [B, T]`` log-probs of the sampled tokens under the current policy
and the ratio's anchor (the behaviour policy, or the proximal one under an off-policy
correction, see offpolicy.py); ``adv: [B]`` one advantage per sequence, or ``[B, T]`` one per
token (PPO's GAE; ``per_token_advantage``); ``mask: [B, T]`` 1 on completion tokens. Optional
``kl: [B, T]`` is added with weight ``beta`` inside the same aggregation; optional
``weight: [B, T]`` (importance weights, no gradient) scales each token's surrogate. ``B`` = sequences
in this micro-batch.

Normalization over the global batch. A learner splits one optimizer step's batch over ranks
and micro-batches, and each call sees one micro-batch. ``counts`` holds the sizes of the
*whole* global batch (every micro-batch on every rank); each loss divides by the one its
documented mean needs, so a call returns its micro-batch's share and the shares add up to the
global loss (``raypost.train.engine.backward_share`` backpropagates one share).
``counts=None`` takes this micro-batch's own sizes: right when it is the whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from raypost.algos.registry import POLICY_LOSSES


@dataclass(frozen=True)
class BatchCounts:
    """Sizes of one optimizer step's global batch, summed over every micro-batch and rank."""

    sequences: float  # sequences, masked-out ones included
    tokens: float  # loss-mask tokens, before an off-policy correction drops any

    @staticmethod
    def of(mask: torch.Tensor) -> BatchCounts:
        """The sizes of a batch that is the whole global batch. mask: [B, T]."""
        return BatchCounts(float(mask.shape[0]), float(mask.sum()))


@dataclass(frozen=True)
class LossParams:
    eps_low: float = 0.2
    eps_high: float = 0.2
    beta: float = 0.0
    max_tokens: int = 1  # Dr.GRPO's constant normalizer (the generation budget)


def per_token_advantage(adv: torch.Tensor) -> torch.Tensor:
    """``adv`` laid over the tokens: [B] -> [B, 1] (broadcast over T); [B, T] as it is."""
    return adv[:, None] if adv.dim() == 1 else adv


def _clipped_objective(logp, old_logp, adv, p: LossParams, weight=None):
    ratio = torch.exp(logp - old_logp)
    a = per_token_advantage(adv)
    unclipped = ratio * a
    clipped = torch.clamp(ratio, 1 - p.eps_low, 1 + p.eps_high) * a
    per_token = -torch.minimum(unclipped, clipped)
    clip_hit = (clipped < unclipped).float()  # the clip bound was the active term
    if weight is not None:
        per_token = per_token * weight
    return per_token, ratio, clip_hit


@torch.no_grad()
def _metrics(per_token, ratio, clip_hit, mask, kl) -> dict[str, float]:
    ratio = ratio.detach()
    n = mask.sum().clamp(min=1)
    out = {"clip_frac": float((clip_hit * mask).sum() / n), "ratio_mean": float((ratio * mask).sum() / n)}
    if kl is not None:
        out["kl"] = float((kl * mask).sum() / n)
    return out


def _with_kl(per_token, kl, beta):
    return per_token if kl is None or beta == 0 else per_token + beta * kl


@POLICY_LOSSES.register("grpo")
def grpo_loss(logp, old_logp, adv, mask, p: LossParams, kl=None, weight=None, counts=None):
    """GRPO: clipped surrogate, mean over each sequence's tokens, then mean over sequences.
    Normalizer: ``counts.sequences`` (masked-out sequences count, as in TRL)."""
    counts = counts or BatchCounts.of(mask)
    per_token, ratio, clip_hit = _clipped_objective(logp, old_logp, adv, p, weight)
    per_token = _with_kl(per_token, kl, p.beta) * mask
    per_seq = per_token.sum(1) / mask.sum(1).clamp(min=1)
    return per_seq.sum() / max(counts.sequences, 1), _metrics(per_token, ratio, clip_hit, mask, kl)


@POLICY_LOSSES.register("dapo")
def dapo_loss(logp, old_logp, adv, mask, p: LossParams, kl=None, weight=None, counts=None):
    """DAPO: token-level mean over all tokens of the batch, clip-higher (eps_high > eps_low).
    Normalizer: ``counts.tokens``."""
    counts = counts or BatchCounts.of(mask)
    per_token, ratio, clip_hit = _clipped_objective(logp, old_logp, adv, p, weight)
    per_token = _with_kl(per_token, kl, p.beta) * mask
    return per_token.sum() / max(counts.tokens, 1), _metrics(per_token, ratio, clip_hit, mask, kl)


@POLICY_LOSSES.register("dr_grpo")
def dr_grpo_loss(logp, old_logp, adv, mask, p: LossParams, kl=None, weight=None, counts=None):
    """Dr.GRPO: sum over tokens divided by a constant (max_tokens), mean over sequences; no
    length normalization (pair with the 'grpo' advantage with std_normalize=False).
    Normalizer: ``max_tokens x counts.sequences``."""
    counts = counts or BatchCounts.of(mask)
    per_token, ratio, clip_hit = _clipped_objective(logp, old_logp, adv, p, weight)
    per_token = _with_kl(per_token, kl, p.beta) * mask
    return per_token.sum() / (p.max_tokens * max(counts.sequences, 1)), _metrics(per_token, ratio, clip_hit, mask, kl)
