"""Reward-model losses: pure functions of the scalar scores of chosen and rejected responses."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def bradley_terry_loss(
    chosen: torch.Tensor,
    rejected: torch.Tensor,
    margin: torch.Tensor | None = None,
    center_coef: float = 0.0,
    norm: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Bradley-Terry pairwise loss, as in InstructGPT and TRL's RewardTrainer.

    Args:
        chosen: [B] scores r(x, y_w) of the preferred responses.
        rejected: [B] scores r(x, y_l) of the other responses.
        margin: optional [B] required gap m (Llama-2 style): -log sigmoid(r_w - r_l - m).
        center_coef: weight of the centering term mean((r_w + r_l)^2), which keeps scores near 0
            (Eisenstein et al. 2023; TRL ``center_rewards_coefficient``).
        norm: the normalizer of both means, the pairs of the global batch (every micro-batch
            and rank), so the shares of a split batch add up to its mean; None: B.

    Returns:
        (scalar loss, metrics of this batch: {"loss": its mean, "accuracy": share with r_w > r_l,
        "margin": mean r_w - r_l, "chosen": mean r_w, "rejected": mean r_l}).
    """
    diff = chosen - rejected
    per_pair = -F.logsigmoid(diff - margin if margin is not None else diff)
    if center_coef:
        per_pair = per_pair + center_coef * (chosen + rejected) ** 2
    loss = per_pair.sum() / (float(len(diff)) if norm is None else max(norm, 1.0))
    metrics = {
        "loss": per_pair.mean().item(),
        "accuracy": (diff > 0).float().mean().item(),
        "margin": diff.mean().item(),
        "chosen": chosen.mean().item(),
        "rejected": rejected.mean().item(),
    }
    return loss, metrics
