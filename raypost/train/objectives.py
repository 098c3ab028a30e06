"""Token objectives of the SFT learner: cross-entropy on the labels, or offline KD against
the teacher's stored top-k (``data.teacher``) mixed with cross-entropy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from raypost.algos.distill import KDParams, kd_loss
from raypost.data.tokenize import IGNORE_INDEX
from raypost.train.batches import token_loss_sums

# (logits [B, T, V], collated batch) -> (loss summed over supervised tokens, their count, metrics)
Objective = Callable[[torch.Tensor, dict[str, torch.Tensor]], tuple[torch.Tensor, torch.Tensor, dict[str, float]]]


def cross_entropy(logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor,
                                                                                   dict[str, float]]:
    loss, n = token_loss_sums(logits, batch["labels"])
    return loss, n, {}


@dataclass(frozen=True)
class TeacherKD:
    """kd_weight * tau^2 * D(teacher top-k, student) + (1 - kd_weight) * CE, per supervised token."""

    params: KDParams

    def __call__(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor,
                                                                                       dict[str, float]]:
        mask = batch["labels"][:, 1:] != IGNORE_INDEX  # logits at t predict token t+1
        student = logits[:, :-1][mask]
        ids, logp = batch["teacher_ids"][:, :-1][mask], batch["teacher_logprobs"][:, :-1][mask]
        kd_sum, n, metrics = kd_loss(student, ids, logp, torch.ones(len(student)), self.params)
        w = self.params.kd_weight
        if w == 1.0:
            return kd_sum, n, metrics
        ce_sum, _ = token_loss_sums(logits, batch["labels"])
        metrics["ce"] = float(ce_sum.detach() / n.clamp(min=1))
        return w * kd_sum + (1 - w) * ce_sum, n, metrics


def objective_for(kd: dict[str, Any] | None) -> Objective:
    """Cross-entropy, or offline KD when the loop config carries ``kd`` (KDParams fields)."""
    return cross_entropy if kd is None else TeacherKD(KDParams(**kd))
