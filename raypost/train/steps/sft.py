"""The SFT step (and offline KD, whose objective adds the teacher's stored top-k): the
objective's sum over supervised tokens, divided by the supervised tokens of the whole global
batch, so the loss is the global token mean however the batch is split."""

from __future__ import annotations

from typing import Any

import torch

from raypost.data.collate import collate
from raypost.train.batches import micro_batches, to_device
from raypost.train.collectives import all_sum
from raypost.train.objectives import Objective, cross_entropy, objective_tokens
from raypost.train.steps import accumulate, mean_metrics


def forward_loss(
    engine: Any, batch: dict[str, torch.Tensor], objective: Objective = cross_entropy
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """(loss summed over the objective's tokens, their count, metrics) of one collated batch."""
    batch = to_device(batch, engine.device)
    out = engine(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
        use_cache=False,
    )
    return objective(out.logits, batch)


def train_step(
    engine: Any, rows: list[dict[str, Any]], pad_id: int, micro: int, objective: Objective = cross_entropy
) -> tuple[float, int, dict[str, float]]:
    """One optimizer step over this rank's rows of the global batch. Returns (this rank's share
    of the global loss: the shares add up to it over ranks, real tokens seen, the objective's
    metrics averaged over micro-batches)."""
    (norm,) = all_sum(float(objective_tokens(objective, rows)))

    def loss_of(mb: list[dict[str, Any]]) -> tuple[torch.Tensor, dict[str, float]]:
        s, _, metrics = forward_loss(engine, collate(mb, pad_id), objective)
        return s / max(norm, 1.0), metrics

    share, per_chunk = accumulate(engine, list(micro_batches(rows, micro)), loss_of)
    return share, sum(len(r["input_ids"]) for r in rows), mean_metrics(per_chunk)
