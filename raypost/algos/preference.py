"""Offline preference losses (DPO and its variants) as pure functions, registered by name
(``dpo.loss``). Each takes the summed completion log-probs of a batch of B pairs under the policy
and the frozen reference, and returns ``(loss, metrics)``; the loss is the batch's share of the
global batch's mean (``norm``: the pairs of every micro-batch and rank).

Implicit rewards, as TRL logs them: r = beta * (log pi(y|x) - log ref(y|x)) for DPO and IPO, and
r = beta * (log pi(y|x) / |y|) for the reference-free SimPO.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from raypost.algos.registry import PREFERENCE_LOSSES


@dataclass
class PairLogps:
    """Summed completion log-probs of B pairs, and their completion lengths."""

    chosen: torch.Tensor  # [B] log pi(y_w | x), summed over y_w's tokens
    rejected: torch.Tensor  # [B] log pi(y_l | x)
    chosen_len: torch.Tensor  # [B] |y_w| in tokens (float)
    rejected_len: torch.Tensor  # [B] |y_l|


@dataclass(frozen=True)
class PreferenceParams:
    beta: float = 0.1  # DPO/IPO: the KL-penalty strength (IPO: the target margin is 1 / (2 beta)); SimPO: reward scale
    label_smoothing: float = 0.0  # sigmoid: the share of labels taken as flipped (cDPO, Mitchell 2023)
    simpo_gamma: float = 0.5  # SimPO: the target reward margin
    nll_weight: float = 0.0  # RPO (Pang et al. 2024): weight of the chosen response's per-token NLL


def _finish(
    per_pair: torch.Tensor, r_w: torch.Tensor, r_l: torch.Tensor, norm: float, policy: PairLogps, p: PreferenceParams
) -> tuple[torch.Tensor, dict[str, float]]:
    """Each pair's loss plus ``p.nll_weight`` times its chosen response's mean per-token NLL
    (RPO; TRL's ``sft`` loss term takes the batch's token mean), summed over ``norm``; and metrics."""
    nll = -policy.chosen / policy.chosen_len  # [B]
    if p.nll_weight:
        per_pair = per_pair + p.nll_weight * nll
    with torch.no_grad():
        metrics = {
            "loss": per_pair.mean().item(),
            "nll_chosen": nll.mean().item(),
            "reward_chosen": r_w.mean().item(),
            "reward_rejected": r_l.mean().item(),
            "reward_margin": (r_w - r_l).mean().item(),
            "reward_accuracy": (r_w > r_l).float().mean().item(),
        }
    return per_pair.sum() / max(norm, 1.0), metrics


@PREFERENCE_LOSSES.register("sigmoid")
def sigmoid_dpo(
    policy: PairLogps, ref: PairLogps, p: PreferenceParams, norm: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """DPO (Rafailov et al. 2023): -log sigmoid(z), z = beta * ((pi_w - ref_w) - (pi_l - ref_l));
    with label smoothing eps, -(1 - eps) log sigmoid(z) - eps log sigmoid(-z)."""
    r_w, r_l = p.beta * (policy.chosen - ref.chosen), p.beta * (policy.rejected - ref.rejected)
    z = r_w - r_l
    per_pair = -(1 - p.label_smoothing) * F.logsigmoid(z) - p.label_smoothing * F.logsigmoid(-z)
    return _finish(per_pair, r_w, r_l, norm, policy, p)


@PREFERENCE_LOSSES.register("ipo")
def ipo(policy: PairLogps, ref: PairLogps, p: PreferenceParams, norm: float) -> tuple[torch.Tensor, dict[str, float]]:
    """IPO (Azar et al. 2023), on per-token log-ratios as TRL computes it: (h - 1 / (2 beta))^2,
    h = (pi_w - ref_w) / |y_w| - (pi_l - ref_l) / |y_l|."""
    h = (policy.chosen - ref.chosen) / policy.chosen_len - (policy.rejected - ref.rejected) / policy.rejected_len
    per_pair = (h - 1 / (2 * p.beta)) ** 2
    r_w, r_l = p.beta * (policy.chosen - ref.chosen), p.beta * (policy.rejected - ref.rejected)
    return _finish(per_pair, r_w, r_l, norm, policy, p)


@PREFERENCE_LOSSES.register("simpo")
def simpo(
    policy: PairLogps, ref: PairLogps | None, p: PreferenceParams, norm: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """SimPO (Meng et al. 2024), reference-free: -log sigmoid(beta * (pi_w / |y_w| - pi_l / |y_l|) - gamma)."""
    r_w, r_l = p.beta * policy.chosen / policy.chosen_len, p.beta * policy.rejected / policy.rejected_len
    per_pair = -F.logsigmoid(r_w - r_l - p.simpo_gamma)
    return _finish(per_pair, r_w, r_l, norm, policy, p)


NEEDS_REFERENCE = {"sigmoid": True, "ipo": True, "simpo": False}
