"""Advantage estimators over groups of G samples per prompt. Pure functions.

All take ``rewards: [B, G]`` (B prompts, G samples each) and return advantages ``[B, G]``
(one scalar per sample, broadcast over its tokens by the loss).
"""

from __future__ import annotations

import torch

from raypost.algos.registry import ADVANTAGES


def _centered(rewards: torch.Tensor) -> torch.Tensor:
    """r - mean_group, exactly 0 for a group whose rewards are all equal. (In float32 the mean
    of eight 0.1s is not 0.1; divided by a tiny std, that rounding error became advantages of
    about 0.01 with random signs, which Adam turned into full-size random updates.)"""
    same = (rewards == rewards[:, :1]).all(dim=1, keepdim=True)
    return (rewards - rewards.mean(dim=1, keepdim=True)).masked_fill(same, 0.0)


@ADVANTAGES.register("grpo")
def grpo(rewards: torch.Tensor, eps: float = 1e-6, std_normalize: bool = True) -> torch.Tensor:
    """GRPO: (r - mean_group) / (std_group + eps); ``std_normalize=False`` is Dr.GRPO's
    version (no std division). std is the unbiased sample std, as in TRL."""
    centered = _centered(rewards)
    if not std_normalize:
        return centered
    return centered / (rewards.std(dim=1, keepdim=True) + eps)


@ADVANTAGES.register("rloo")
def rloo(rewards: torch.Tensor, eps: float = 1e-6, std_normalize: bool = False) -> torch.Tensor:
    """RLOO: r_i minus the mean of the other G-1 samples' rewards = G/(G-1) * (r_i - mean)."""
    g = rewards.shape[1]
    if g < 2:
        raise ValueError("RLOO needs at least 2 samples per prompt")
    return _centered(rewards) * g / (g - 1)


@ADVANTAGES.register("reinforce_pp")
def reinforce_pp(rewards: torch.Tensor, eps: float = 1e-6, std_normalize: bool = True) -> torch.Tensor:
    """REINFORCE++ with baseline: subtract the group mean, then normalize by the std of the
    whole batch (not per group), which is stabler when a group's rewards are all equal."""
    centered = _centered(rewards)
    if not std_normalize:
        return centered
    return centered / (centered.std() + eps)
