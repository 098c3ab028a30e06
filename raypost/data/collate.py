"""Rows -> model inputs: right padding and block-diagonal attention for packed examples."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from raypost.data.tokenize import IGNORE_INDEX


def block_causal_mask(segment_ids: torch.Tensor) -> torch.Tensor:
    """Boolean attention mask [B, 1, T, T]: token i sees token j iff j <= i and both lie in the
    same example (segment id > 0). Padding (segment 0) sees only itself, which keeps SDPA
    free of all-masked rows; its labels are ignored anyway.

    segment_ids: [B, T] int, 0 = padding, 1..k = packed examples.
    """
    b, t = segment_ids.shape
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    causal = torch.tril(torch.ones(t, t, dtype=torch.bool))
    real = (segment_ids > 0)[:, :, None]
    eye = torch.eye(t, dtype=torch.bool).expand(b, t, t)
    return ((same & causal & real) | eye)[:, None]


def collate(rows: Sequence[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad rows of input_ids/labels/position_ids/segment_ids into model inputs."""
    t = max(len(r["input_ids"]) for r in rows)
    b = len(rows)
    ids = torch.full((b, t), pad_id, dtype=torch.long)
    labels = torch.full((b, t), IGNORE_INDEX, dtype=torch.long)
    pos = torch.zeros((b, t), dtype=torch.long)
    seg = torch.zeros((b, t), dtype=torch.long)
    for i, r in enumerate(rows):
        n = len(r["input_ids"])
        ids[i, :n] = torch.from_numpy(np.array(r["input_ids"], dtype=np.int64))
        labels[i, :n] = torch.from_numpy(np.array(r["labels"], dtype=np.int64))
        pos[i, :n] = torch.from_numpy(np.array(r["position_ids"], dtype=np.int64))
        seg[i, :n] = torch.from_numpy(np.array(r["segment_ids"], dtype=np.int64))
    out = {"input_ids": ids, "labels": labels, "position_ids": pos, "attention_mask": block_causal_mask(seg)}
    if "teacher_ids" in rows[0]:
        out.update(_teacher_columns(rows, t), segment_ids=seg)  # offline KD may fit prompt positions too
    return out


def _teacher_columns(rows: Sequence[dict[str, Any]], t: int) -> dict[str, torch.Tensor]:
    """The offline teacher's flat top-k columns (see ``data.teacher``) as [B, T, k]; padding
    positions get id 0 and log-prob 0 (never trained: their labels are ignored)."""
    k = len(rows[0]["teacher_ids"]) // len(rows[0]["input_ids"])
    ids = torch.zeros((len(rows), t, k), dtype=torch.long)
    logp = torch.zeros((len(rows), t, k), dtype=torch.float32)
    for i, r in enumerate(rows):
        n = len(r["input_ids"])
        ids[i, :n] = torch.from_numpy(np.array(r["teacher_ids"], dtype=np.int64).reshape(n, k))
        logp[i, :n] = torch.from_numpy(np.array(r["teacher_logprobs"], dtype=np.float32).reshape(n, k))
    return {"teacher_ids": ids, "teacher_logprobs": logp}
