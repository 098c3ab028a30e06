"""Distillation losses over the teacher's top-k support. Pure functions: tensors in,
``(loss_sum, count, metrics)`` out. The loss is the *sum* over positions: a learner divides it
by the supervised positions of the whole global batch (every micro-batch and rank), which makes
the step's loss the token mean over that batch however it is split.

Shapes: ``student_logits: [N, V]`` one row per supervised position; ``teacher_ids: [N, k]``
and ``teacher_logprobs: [N, k]`` the teacher's k most likely next tokens and their log-probs
(full-vocabulary softmax at temperature 1, as stored by the teacher pass); ``mask: [N]`` 1
where the position is trained.

On the support S (the teacher's top k):
  p = softmax(teacher_logprobs / tau) over S (exact: renormalizing is the same as a
      temperature softmax of the teacher's logits restricted to S);
  forward KL uses the student's full-vocabulary log-probs on S, so student mass outside S
      still costs (sum over S of q <= 1 keeps the KL >= 0);
  reverse KL and JSD use the student renormalized on S, so both sides are distributions.
Divergences are scaled by tau^2 (Hinton et al.), so gradients keep their size across tau.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from raypost.algos.registry import Registry

DIVERGENCES = Registry("distillation divergence")


@dataclass(frozen=True)
class KDParams:
    divergence: str = "forward_kl"
    beta: float = 0.5  # generalized JSD mixture weight of the teacher: m = beta*p + (1-beta)*q
    temperature: float = 1.0
    kd_weight: float = 1.0  # loss = kd_weight * tau^2 * D + (1 - kd_weight) * CE
    positions: str = "completion"  # offline KD: the divergence on completion tokens, or on every token ("all")


def _kl(log_a: torch.Tensor, log_b: torch.Tensor) -> torch.Tensor:
    """KL(a || b) per row over the last dim, from log-probs of two distributions on S."""
    return (log_a.exp() * (log_a - log_b)).sum(-1)


@DIVERGENCES.register("forward_kl")
def forward_kl(student_logp: torch.Tensor, teacher_logp: torch.Tensor, beta: float) -> torch.Tensor:
    """KL(p || q): mean-seeking; student_logp are full-vocabulary log-probs gathered on S. [N]"""
    return _kl(teacher_logp, student_logp)


@DIVERGENCES.register("reverse_kl")
def reverse_kl(student_logp: torch.Tensor, teacher_logp: torch.Tensor, beta: float) -> torch.Tensor:
    """KL(q~ || p) with q~ the student renormalized on S: mode-seeking. [N]"""
    return _kl(torch.log_softmax(student_logp, -1), teacher_logp)


@DIVERGENCES.register("jsd")
def generalized_jsd(student_logp: torch.Tensor, teacher_logp: torch.Tensor, beta: float) -> torch.Tensor:
    """GKD's generalized JSD: beta*KL(p||m) + (1-beta)*KL(q~||m), m = beta*p + (1-beta)*q~.
    At beta = 0 or 1 the mixture equals one side and the loss vanishes, so beta lies in (0, 1). [N]"""
    q = torch.log_softmax(student_logp, -1)
    m = torch.logsumexp(torch.stack([teacher_logp + math.log(beta), q + math.log(1 - beta)]), 0)
    return beta * _kl(teacher_logp, m) + (1 - beta) * _kl(q, m)


def kd_loss(
    student_logits: torch.Tensor,
    teacher_ids: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    mask: torch.Tensor,
    p: KDParams,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """Summed tau^2 * divergence over masked positions, their count, and metrics.

    student_logits [N, V]; teacher_ids [N, k] (long); teacher_logprobs [N, k]; mask [N].
    """
    tau = p.temperature
    # Selective: log q(id) = x_id - logsumexp(x) on the k ids only, so no [N, V] log-softmax is
    # kept for backward (torchtune / prime-rl style; a 49k vocabulary makes that one large).
    scaled = student_logits.float() / tau if tau != 1.0 else student_logits.float()
    student_logp = scaled.gather(-1, teacher_ids) - torch.logsumexp(scaled, -1, keepdim=True)
    teacher_logp = torch.log_softmax(teacher_logprobs.float() / tau, -1)
    per_pos = DIVERGENCES.get_fn(p.divergence)(student_logp, teacher_logp, p.beta) * tau**2
    m = mask.float()
    with torch.no_grad():
        n = m.sum().clamp(min=1)
        support = (student_logp.exp().sum(-1) * m).sum() / n
        agree = ((student_logits.argmax(-1) == teacher_ids[:, 0]).float() * m).sum() / n
    return (
        (per_pos * m).sum(),
        m.sum(),
        {
            "kd": float((per_pos.detach() * m).sum() / n),
            "student_mass_on_topk": float(support),
            "top1_agreement": float(agree),
        },
    )


def on_policy_reverse_kl(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    teacher_logp: torch.Tensor,
    mask: torch.Tensor,
    norm: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """On-policy distillation with the reverse KL as a dense per-token advantage.

    logp [N, T]: sampled tokens under the current student; old_logp [N, T]: under the student
    that sampled them (the rollout replica); teacher_logp [N, T]: under the teacher; mask [N, T].
    A_t = teacher_logp - old_logp (minus the single-sample estimate of KL(student || teacher)
    at token t, no discounting), in an importance-weighted policy gradient:
    loss = -sum(exp(logp - old_logp) * A * mask) / n. Its gradient at logp = old_logp
    is -A_t / n per token: raise the tokens the teacher likes more than the student does.
    Normalizer: ``norm`` = n, the sampled tokens of the global batch (every micro-batch and
    rank), so micro-batch shares add up to the global token mean; None: this batch's sum(mask).
    """
    adv = (teacher_logp - old_logp).detach()
    ratio = torch.exp(logp - old_logp.detach())
    n = mask.sum().clamp(min=1)
    loss = -(ratio * adv * mask).sum() / (n if norm is None else max(norm, 1.0))
    with torch.no_grad():
        reverse_kl = float(-(adv * mask).sum() / n)
        ratio_mean = float((ratio * mask).sum() / n)
    return loss, {"reverse_kl": reverse_kl, "ratio_mean": ratio_mean}
