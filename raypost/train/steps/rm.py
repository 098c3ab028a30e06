"""The reward model's step: Bradley-Terry over (chosen, rejected) pairs, the mean over the
pairs of the whole global batch. Chosen and rejected encodings of a micro-batch go through the
model in one forward pass."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from raypost.algos.pairwise import bradley_terry_loss
from raypost.config.reward_model import RewardModelConfig
from raypost.train.batches import micro_batches, to_device
from raypost.train.collectives import all_sum
from raypost.train.steps import accumulate, mean_metrics


def load_reward_model(path: str, model_cfg: Any, precision: str) -> torch.nn.Module:
    """The sequence classifier the reward model trains (``build_learner``'s ``load``)."""
    from raypost.models.hf import load_sequence_classifier

    model = load_sequence_classifier(path, precision)
    if model_cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def pair_inputs(rows: list[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    """[2B, T] right-padded inputs: the B chosen encodings, then the B rejected ones."""
    seqs = [r["chosen_ids"] for r in rows] + [r["rejected_ids"] for r in rows]
    types = [r["chosen_types"] for r in rows] + [r["rejected_types"] for r in rows]
    t = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), t), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), t), dtype=torch.long)
    tt = torch.zeros((len(seqs), t), dtype=torch.long)
    for i, (s, ty) in enumerate(zip(seqs, types)):
        ids[i, : len(s)] = torch.from_numpy(np.array(s, dtype=np.int64))
        mask[i, : len(s)] = 1
        if len(ty):
            tt[i, : len(ty)] = torch.from_numpy(np.array(ty, dtype=np.int64))
    out = {"input_ids": ids, "attention_mask": mask}
    if any(len(ty) for ty in types):
        out["token_type_ids"] = tt
    return out


def scores(engine: Any, rows: list[dict[str, Any]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen [B], rejected [B]) scores of ``rows``."""
    logits = engine(**to_device(pair_inputs(rows, pad_id), engine.device)).logits[:, 0].float()
    return logits[: len(rows)], logits[len(rows) :]


def all_mean(values: list[float], counts: float) -> list[float]:
    """Means over every rank of ``values``, each this rank's mean over ``counts`` items."""
    *sums, total = all_sum(*(v * counts for v in values), counts)
    return [v / max(total, 1.0) for v in sums]


def train_step(engine: Any, rows: list[dict[str, Any]], cfg: RewardModelConfig, pad_id: int) -> dict[str, float]:
    """One optimizer step over this rank's pairs of the global batch. Returns the metrics as
    means over the global batch."""
    (norm,) = all_sum(float(len(rows)))

    def loss_of(mb: list[dict[str, Any]]) -> tuple[torch.Tensor, dict[str, float]]:
        c, r = scores(engine, mb, pad_id)
        margin = torch.full_like(c, cfg.train.margin) if cfg.train.margin else None
        return bradley_terry_loss(c, r, margin, cfg.train.center_coef, norm)

    chunks = list(micro_batches(rows, cfg.optim.micro_batch_size))
    _, per_chunk = accumulate(engine, chunks, loss_of)
    local = mean_metrics(per_chunk, [len(mb) for mb in chunks])
    keys = sorted(local)
    return dict(zip(keys, all_mean([local[k] for k in keys], float(len(rows)))))
