"""CISPO (MiniMax-M1, 2025): REINFORCE with a clipped, stop-gradient importance weight on every
token, so that no token loses its gradient to the clip (PPO's and GRPO's clipped tokens do):

    loss = -sum_t sg(clip(r_t, 1-eps_low, 1+eps_high)) * A * logp_t / tokens,   r_t = pi / pi_old.

MiniMax-M1 sets no lower bound (``algo.eps_low 1.0``) and tunes the upper one. The ratio is to
the loss's anchor: with ``async_rl.correction tis`` that is the proximal policy (r = 1, and TIS's
own cap truncates the weight to the behaviour policy); with ``correction none`` it is the
behaviour policy, as in the paper.

Shapes as in ``losses.py``. Normalizer: ``counts.tokens`` (token-level, as the paper).
"""

from __future__ import annotations

import torch

from raypost.algos.losses import BatchCounts, LossParams, _metrics, _with_kl, per_token_advantage
from raypost.algos.registry import POLICY_LOSSES


@POLICY_LOSSES.register("cispo")
def cispo_loss(logp, old_logp, adv, mask, p: LossParams, kl=None, weight=None, counts=None):
    """CISPO: -sg(clipped ratio) * A * logp per token, summed over the global batch's tokens.
    ``clip_frac``: tokens whose weight the clip changed (they keep their gradient)."""
    counts = counts or BatchCounts.of(mask)
    with torch.no_grad():
        ratio = torch.exp(logp - old_logp)
        is_weight = torch.clamp(ratio, 1 - p.eps_low, 1 + p.eps_high)
        clip_hit = (is_weight != ratio).float()
    per_token = -is_weight * per_token_advantage(adv) * logp
    if weight is not None:
        per_token = per_token * weight
    per_token = _with_kl(per_token, kl, p.beta) * mask
    return per_token.sum() / max(counts.tokens, 1), _metrics(per_token, ratio, clip_hit, mask, kl)
