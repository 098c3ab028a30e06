"""Per-token KL(pi_theta || pi_ref) estimators from sampled tokens (Schulman's k1/k2/k3).

Each takes ``logp, ref_logp: [B, T]`` (log-probs of the sampled tokens under the policy and
the frozen reference) and returns ``[B, T]``.
"""

from __future__ import annotations

import torch

from raypost.algos.registry import KL_ESTIMATORS


@KL_ESTIMATORS.register("k1")
def k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """log(pi/pi_ref): unbiased, high variance, can be negative."""
    return logp - ref_logp


@KL_ESTIMATORS.register("k2")
def k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """0.5 * (log(pi/pi_ref))^2: biased, low variance, >= 0."""
    return 0.5 * (logp - ref_logp) ** 2


@KL_ESTIMATORS.register("k3")
def k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """pi_ref/pi - 1 - log(pi_ref/pi): unbiased, low variance, >= 0 (GRPO paper's choice)."""
    log_ratio = ref_logp - logp
    return torch.exp(log_ratio) - 1 - log_ratio
