"""Reward-model losses: pure functions of the scalar scores of chosen and rejected responses."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor, margin: torch.Tensor | None = None,
                       center_coef: float = 0.0) -> tuple[torch.Tensor, dict[str, float]]:
    """Bradley-Terry pairwise loss, as in InstructGPT and TRL's RewardTrainer.

    Args:
        chosen: [B] scores r(x, y_w) of the preferred responses.
        rejected: [B] scores r(x, y_l) of the other responses.
        margin: optional [B] required gap m (Llama-2 style): -log sigmoid(r_w - r_l - m).
        center_coef: weight of the centering term mean((r_w + r_l)^2), which keeps scores near 0
            (Eisenstein et al. 2023; TRL ``center_rewards_coefficient``).

    Returns:
        (scalar loss, {"loss", "accuracy": share with r_w > r_l, "margin": mean r_w - r_l,
        "chosen": mean r_w, "rejected": mean r_l}).
    """
    diff = chosen - rejected
    loss = -F.logsigmoid(diff - margin if margin is not None else diff).mean()
    if center_coef:
        loss = loss + center_coef * ((chosen + rejected) ** 2).mean()
    metrics = {"loss": loss.item(), "accuracy": (diff > 0).float().mean().item(), "margin": diff.mean().item(),
               "chosen": chosen.mean().item(), "rejected": rejected.mean().item()}
    return loss, metrics
