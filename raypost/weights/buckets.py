"""The learner's end of a push: its weights read as buckets of CPU tensors, one bucket at a time,
under any ZeRO stage, for a channel's ``publish_stream``."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from raypost.weights.specs import Spec, specs_of


def weight_buckets(
    engine: Any, zero_stage: int, bucket_bytes: int
) -> tuple[list[Spec], Iterator[dict[str, torch.Tensor]]]:
    """The weights a replica serves, as (specs, buckets): CPU copies of at most ``bucket_bytes``
    each (a larger tensor is a bucket of its own), made one bucket at a time as they are consumed.

    Under ZeRO-3 every rank gathers each bucket's parameters together (``GatheredParameters``)
    and only rank 0 copies them out (other ranks get empty buckets): no rank ever holds more than
    one gathered bucket, where ``_zero3_consolidated_16bit_state_dict`` gathers the whole model
    on rank 0. Tied output embeddings are left out (the replica ties them itself); a LoRA model
    gives its merged weights (``full_state_dict``)."""
    module = engine.module
    tied = getattr(module.config, "tie_word_embeddings", False)
    if zero_stage == 3:
        params = [(k, p) for k, p in module.named_parameters() if not (tied and k == "lm_head.weight")]
        specs = [(k, str(p.dtype).removeprefix("torch."), list(p.ds_shape)) for k, p in params]
        return specs, _gathered(params, bucket_bytes)
    from raypost.models.lora import is_peft, merged_state_dict

    if dist.is_initialized() and dist.get_rank() != 0:
        return [], iter(())
    state = merged_state_dict(module) if is_peft(module) else module.state_dict()
    state = {k: v for k, v in state.items() if not (tied and k == "lm_head.weight")}
    sized = _split(state.items(), bucket_bytes, lambda v: v.numel() * v.element_size())
    return specs_of(state), (_copied(group) for group in sized)


def _split(items: Iterable[tuple[str, Any]], bucket_bytes: int, size: Any) -> Iterator[list[tuple[str, Any]]]:
    """``items`` in order, grouped into runs of at most ``bucket_bytes`` (``size(x)`` bytes each)."""
    group: list[tuple[str, Any]] = []
    total = 0
    for name, x in items:
        n = size(x)
        if group and total + n > bucket_bytes:
            yield group
            group, total = [], 0
        group.append((name, x))
        total += n
    if group:
        yield group


def _copied(group: list[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in group}


def _gathered(params: list[tuple[str, Any]], bucket_bytes: int) -> Iterator[dict[str, torch.Tensor]]:
    import deepspeed

    rank0 = not dist.is_initialized() or dist.get_rank() == 0
    for group in _split(params, bucket_bytes, lambda p: p.ds_numel * p.element_size()):
        with deepspeed.zero.GatheredParameters([p for _, p in group], modifier_rank=None):
            bucket = _copied(group) if rank0 else {}
        yield bucket  # the gathered parameters are released before the bucket is passed on
