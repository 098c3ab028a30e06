"""Batch shaping for learners: global batches sliced per rank, micro-batches, token counts.
Rows become model inputs in ``raypost.data.collate``."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from raypost.data.tokenize import IGNORE_INDEX


def to_device(batch: dict[str, torch.Tensor], device: torch.device | str) -> dict[str, torch.Tensor]:
    """Every tensor of ``batch`` on the learner's device (``engine.device``); a no-op on CPU."""
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def rank_slice(batch: dict[str, np.ndarray], rank: int, world: int) -> list[dict[str, Any]]:
    """This rank's rows of a global batch (rows rank, rank+world, ...)."""
    n = len(next(iter(batch.values())))
    return [{k: v[i] for k, v in batch.items()} for i in range(rank, n, world)]


def micro_batches(rows: list[dict[str, Any]], size: int) -> Iterator[list[dict[str, Any]]]:
    for i in range(0, len(rows), size):
        yield rows[i : i + size]


def supervised_tokens(rows: Sequence[dict[str, Any]]) -> int:
    """Positions whose next-token label is supervised: the count ``token_loss_sums`` returns
    for these rows, known before any forward pass."""
    return int(sum((np.asarray(r["labels"][1:]) != IGNORE_INDEX).sum() for r in rows))


def token_loss_sums(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed next-token cross-entropy over supervised positions, and their count.

    logits: [B, T, V]; labels: [B, T] with IGNORE_INDEX where unsupervised.
    """
    shift_logits = logits[:, :-1].float()
    shift_labels = labels[:, 1:]
    loss = torch.nn.functional.cross_entropy(
        shift_logits.reshape(-1, shift_logits.size(-1)),
        shift_labels.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )
    return loss, (shift_labels != IGNORE_INDEX).sum()
