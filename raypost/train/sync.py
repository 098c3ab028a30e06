"""What learners that sample from Serve replicas share: rank 0's batch sent to every rank,
and the weights pushed to the replicas as a new version."""

from __future__ import annotations

import time
from typing import Any

import torch.distributed as dist

from raypost.serve.channel import WeightChannel
from raypost.train.engine import full_state_dict


def broadcast_from_rank0(obj: Any, rank: int) -> Any:
    box = [obj if rank == 0 else None]
    if dist.is_initialized():
        dist.broadcast_object_list(box, src=0)
    return box[0]


def push_weights(engine: Any, zero_stage: int, version: int, chan: WeightChannel, rank: int) -> float:
    """Gather the full weights and publish them as ``version`` (rank 0 publishes); returns seconds."""
    t0 = time.perf_counter()
    state = full_state_dict(engine, zero_stage)
    if rank == 0:
        tied = getattr(engine.module.config, "tie_word_embeddings", False)
        chan.publish(version, {k: v for k, v in state.items() if not (tied and k == "lm_head.weight")})
    if dist.is_initialized():
        dist.barrier()
    return time.perf_counter() - t0
