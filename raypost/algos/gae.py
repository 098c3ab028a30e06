"""PPO's critic side: per-token rewards, GAE, advantage whitening and the clipped value loss.
Pure functions: tensors in, tensors (or ``(loss, metrics)``) out.

Shapes: ``values, old_values, returns, mask: [B, T]`` over a batch's T next-token targets,
laid out as the policy's log-probs are (``rl.records.LearnerBatch``): column t is the state
before the token at t + 1 is sampled, and ``mask`` is 1 on the tokens the policy sampled. A
multi-turn episode's observation tokens (mask 0) are skipped: GAE runs over each row's masked
tokens as one sequence, so the value before an observation bootstraps from the value after it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from raypost.algos.losses import BatchCounts


def terminal_rewards(reward: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T]: each row's sequence reward (``reward: [B]``) on its last masked token, 0 elsewhere
    (a row with no masked token gets none)."""
    t = torch.arange(mask.shape[1], device=mask.device)
    last = torch.where(mask > 0, t, -1).max(dim=1).values  # [B] the last masked column, -1 if none
    out = torch.zeros_like(mask, dtype=reward.dtype)
    has = last >= 0
    out[has, last[has]] = reward[has]
    return out


@torch.no_grad()
def gae(
    values: torch.Tensor, rewards: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation (Schulman et al. 2016) over each row's masked tokens:
    delta_t = r_t + gamma * V_next - V_t, A_t = delta_t + gamma * lam * A_next, with V and A after
    the last masked token 0 (the episode ends). Returns (advantages, returns = A + V), both 0 off
    the mask."""
    b, t_len = mask.shape
    adv = torch.zeros_like(values)
    next_value = torch.zeros(b, dtype=values.dtype, device=values.device)
    next_adv = torch.zeros_like(next_value)
    for t in reversed(range(t_len)):
        on = mask[:, t] > 0
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        a = delta + gamma * lam * next_adv
        adv[:, t] = torch.where(on, a, torch.zeros_like(a))
        next_adv = torch.where(on, a, next_adv)
        next_value = torch.where(on, values[:, t], next_value)
    return adv, (adv + values) * mask


@dataclass(frozen=True)
class Moments:
    """Sums over the masked tokens of a whole global batch (every rank): for whitening and for
    the explained variance."""

    n: float
    total: float
    squares: float

    @staticmethod
    def of(x: torch.Tensor, mask: torch.Tensor) -> Moments:
        m = mask.to(x.dtype)
        return Moments(float(m.sum()), float((x * m).sum()), float((x * x * m).sum()))

    @property
    def mean(self) -> float:
        return self.total / max(self.n, 1.0)

    @property
    def var(self) -> float:
        """The population variance (the mean of squares less the squared mean), at least 0."""
        return max(self.squares / max(self.n, 1.0) - self.mean**2, 0.0)


def whiten(adv: torch.Tensor, mask: torch.Tensor, moments: Moments, eps: float = 1e-8) -> torch.Tensor:
    """(A - mean) / std over the global batch's masked tokens (``moments`` of A), 0 off the mask."""
    return (adv - moments.mean) / (moments.var**0.5 + eps) * mask


def explained_variance(residual: Moments, returns: Moments) -> float:
    """1 - Var[R - V] / Var[R] over the masked tokens: 1 for a perfect critic, 0 for one that
    predicts the mean return, negative for a worse one (nan when the returns do not vary)."""
    return 1.0 - residual.var / returns.var if returns.var > 0 else float("nan")


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float,
    counts: BatchCounts | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped value loss of PPO2: 0.5 * max((V - R)^2, (V_clip - R)^2) with V_clip =
    old_V + clamp(V - old_V, -clip, clip), the mean over the global batch's masked tokens
    (``counts.tokens``; None: this batch's own). Metrics: the share of tokens where the clipped
    term was the larger."""
    counts = counts or BatchCounts.of(mask)
    clipped = old_values + torch.clamp(values - old_values, -clip, clip)
    plain, bounded = (values - returns) ** 2, (clipped - returns) ** 2
    per_token = 0.5 * torch.maximum(plain, bounded) * mask
    n = mask.sum().clamp(min=1)
    metrics = {"vf_clip_frac": float(((bounded > plain).float() * mask).sum() / n)}
    return per_token.sum() / max(counts.tokens, 1.0), metrics
