"""Token objectives of the SFT learner: cross-entropy on the labels, or offline KD against
the teacher's stored top-k (``data.teacher``) mixed with cross-entropy."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from raypost.algos.distill import KDParams, kd_loss
from raypost.data.tokenize import IGNORE_INDEX
from raypost.train.batches import supervised_tokens, token_loss_sums

# (logits [B, T, V], collated batch) -> (loss summed over supervised tokens, their count, metrics)
Objective = Callable[[torch.Tensor, dict[str, torch.Tensor]], tuple[torch.Tensor, torch.Tensor, dict[str, float]]]


def cross_entropy(
    logits: torch.Tensor, batch: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    loss, n = token_loss_sums(logits, batch["labels"])
    return loss, n, {}


@dataclass(frozen=True)
class TeacherKD:
    """kd_weight * tau^2 * D(teacher top-k, student) + (1 - kd_weight) * CE, per supervised token."""

    params: KDParams

    def __call__(
        self, logits: torch.Tensor, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        mask = kd_mask(batch, self.params.positions)
        student = logits[:, :-1][mask]
        ids, logp = batch["teacher_ids"][:, :-1][mask], batch["teacher_logprobs"][:, :-1][mask]
        kd_sum, n, metrics = kd_loss(student, ids, logp, torch.ones(len(student), device=student.device), self.params)
        w = self.params.kd_weight
        if w == 1.0:
            return kd_sum, n, metrics
        ce_sum, n_ce = token_loss_sums(logits, batch["labels"])
        metrics["ce"] = float(ce_sum.detach() / n_ce.clamp(min=1))
        return w * kd_sum + (1 - w) * ce_sum, n, metrics

    def tokens(self, rows: Sequence[dict[str, Any]]) -> int:
        """The positions ``kd_mask`` selects in these rows, known before any forward pass: the
        loss's normalizer (with ``positions: all`` the CE term is divided by it too)."""
        if self.params.positions == "completion":
            return supervised_tokens(rows)
        return int(sum(_same_next(np.asarray(r["segment_ids"])).sum() for r in rows))


def _same_next(seg: Any) -> Any:
    """Positions whose next token is of the same (real) example: segment ids [..., T] -> [..., T-1]."""
    return (seg[..., 1:] > 0) & (seg[..., 1:] == seg[..., :-1])


def objective_tokens(objective: Objective, rows: Sequence[dict[str, Any]]) -> int:
    """The positions ``objective`` sums its loss over in ``rows`` (cross-entropy: the supervised ones)."""
    return objective.tokens(rows) if isinstance(objective, TeacherKD) else supervised_tokens(rows)


def kd_mask(batch: dict[str, torch.Tensor], positions: str) -> torch.Tensor:
    """[B, T-1] bool: the positions t whose next token t+1 the divergence fits. ``completion``:
    the supervised tokens (labels). ``all``: every token of an example after its first, prompt
    included, as Minitron distills a pruned model; never across two packed examples or into
    padding (``segment_ids`` 0)."""
    if positions == "completion":
        return batch["labels"][:, 1:] != IGNORE_INDEX  # logits at t predict token t+1
    return _same_next(batch["segment_ids"])


def objective_for(kd: dict[str, Any] | None) -> Objective:
    """Cross-entropy, or offline KD when the loop config carries ``kd`` (KDParams fields)."""
    return cross_entropy if kd is None else TeacherKD(KDParams(**kd))
