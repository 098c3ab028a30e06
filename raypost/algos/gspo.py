"""GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization"): the importance ratio and its
clip are per sequence, the geometric mean of the token ratios,

    s_i = exp(mean_t (logp_t - old_logp_t)),   loss_i = -min(s_i A_i, clip(s_i, 1-eps_low, 1+eps_high) A_i),

averaged over sequences. Written in the paper's GSPO-token form, s_i,t = sg(s_i) * pi(y_t) /
sg(pi(y_t)): the same value and, with one advantage per sequence, the same gradient, with a
per-token ``weight`` (an off-policy correction's) and ``kl`` fitting in as in the other losses.
The paper's clip range is about 3e-4 / 4e-4 (``algo.eps_low``/``eps_high``), not PPO's 0.2.

Shapes as in ``losses.py``. Normalizer: ``counts.sequences``.
"""

from __future__ import annotations

import torch

from raypost.algos.losses import BatchCounts, LossParams, _metrics, _with_kl
from raypost.algos.registry import POLICY_LOSSES

MAX_LOG_RATIO = 10.0  # a sequence ratio above e^10 is clamped (as verl does) so exp cannot overflow


def sequence_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B]: the mean over each sequence's completion tokens of log(pi / pi_old)."""
    return ((logp - old_logp) * mask).sum(1) / mask.sum(1).clamp(min=1)


@POLICY_LOSSES.register("gspo")
def gspo_loss(logp, old_logp, adv, mask, p: LossParams, kl=None, weight=None, counts=None):
    """GSPO: sequence-level ratio and clipping; mean over each sequence's tokens (GSPO-token), then
    over the global batch's sequences. ``clip_frac`` counts sequences."""
    counts = counts or BatchCounts.of(mask)
    seq = sequence_log_ratio(logp, old_logp, mask).detach()
    log_s = torch.clamp(seq[:, None] + logp - logp.detach(), max=MAX_LOG_RATIO)  # s_i,t: value s_i
    s = torch.exp(log_s)
    a = adv[:, None]
    unclipped, clipped = s * a, torch.clamp(s, 1 - p.eps_low, 1 + p.eps_high) * a
    per_token = -torch.minimum(unclipped, clipped)
    if weight is not None:
        per_token = per_token * weight
    per_token = _with_kl(per_token, kl, p.beta) * mask
    per_seq = per_token.sum(1) / mask.sum(1).clamp(min=1)
    clip_hit = (clipped < unclipped).float()
    metrics = _metrics(per_token, s, clip_hit, mask, kl)
    metrics["clip_frac"] = float(clip_hit[:, 0].mean()) if len(adv) else 0.0  # the same for every token
    metrics["seq_ratio_mean"] = float(torch.exp(seq).mean()) if len(adv) else 1.0
    return per_seq.sum() / max(counts.sequences, 1), metrics
