"""One optimizer step of each learner: this rank's slice of the global batch in, metrics out.

What differs between the learners lives here (``sft``, ``grpo``, ``onpolicy``, ``rm``); the
micro-batch loop they share is ``accumulate``. Nothing here imports Ray: the Ray Train loops
(``raypost/train/*_loop.py``) call these steps, and ``benchmarks/gpu_check.py`` runs the same
steps under a bare ``torch.distributed`` group on a machine with no Ray.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

from raypost.train.engine import backward_share

T = TypeVar("T")


def accumulate(
    engine: Any, chunks: Sequence[T], loss_of: Callable[[T], tuple[torch.Tensor, dict[str, float]]]
) -> tuple[float, list[dict[str, float]]]:
    """Forward, backward and ``engine.step()`` per micro-batch of ``chunks`` (DeepSpeed steps the
    optimizer at the last one). ``loss_of`` returns a micro-batch's share of the loss normalized
    over the whole global batch (see ``backward_share``) and its metrics. Returns this rank's
    summed share and each micro-batch's metrics."""
    share, per_chunk = 0.0, []
    for mb in chunks:
        loss, metrics = loss_of(mb)
        backward_share(engine, loss)
        engine.step()
        share += loss.item()
        per_chunk.append(metrics)
    return share, per_chunk


def mean_metrics(per_chunk: Sequence[dict[str, float]], weights: Sequence[float] | None = None) -> dict[str, float]:
    """Each metric averaged over the micro-batches (weighted by ``weights``, default equal);
    a metric absent from a micro-batch counts as 0 there."""
    w = list(weights) if weights is not None else [1.0] * len(per_chunk)
    total = sum(w) or 1.0
    out: dict[str, float] = {}
    for m, wi in zip(per_chunk, w):
        for k, v in m.items():
            out[k] = out.get(k, 0.0) + v * wi / total
    return out
