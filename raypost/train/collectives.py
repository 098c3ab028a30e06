"""The learners' host-side collectives: sums of Python numbers, rank 0's objects, barriers.

Every collective a learner makes on host data (loss normalizers, metrics, rank 0's batch, the
end of a push) goes through here, so that it works under every process group a learner can
get:

- gloo alone: Ray Train's CPU workers;
- NCCL alone: Ray Train's ``TorchConfig(backend="nccl")`` on GPU workers. NCCL has no CPU
  backend, so a CPU tensor in ``all_reduce`` fails ("No backend type associated with device
  type cpu"); ``backend="cuda:gloo"`` refuses CPU tensors the same way, on CPUs alone;
- mixed groups such as ``"cpu:gloo,cuda:nccl"``.

When the default group takes no CPU tensors, host data goes over a gloo side group of the same
ranks, made once per default group at the first host collective. Every rank makes its host
collectives in the same order (they are collectives), so every rank makes that group at the
same point, as ``new_group`` requires. Host values stay on the host: no device round trip and
no device synchronization for a few floats, and the same code on every backend.

Nothing here imports Ray: the learners' steps run under a plain ``torch.distributed`` group
(``benchmarks/gpu_check.py`` on a machine without Ray).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

_side: dict[int, Any] = {}  # id of the default group -> its gloo side group for host data


def takes_cpu_tensors(group: Any = None) -> bool:
    """Whether ``group`` (default: the default group) has a backend for CPU tensors.

    ``get_backend_config`` reads ``"cpu:gloo,cuda:nccl"`` for a mixed group, ``"cuda:nccl"``
    for NCCL alone, and ``"cpu:gloo,cuda:gloo"`` for plain ``"gloo"``."""
    config = dist.get_backend_config(group)
    return any(part.split(":")[0].strip() == "cpu" for part in config.split(","))


def host_group() -> Any:
    """The group for host tensors: the default group when it takes CPU tensors, else its gloo
    side group (made on first use; every rank must call, as for any collective)."""
    default = dist.group.WORLD
    if takes_cpu_tensors(default):
        return default
    key = id(default)
    if key not in _side:
        _side.clear()  # a side group of an earlier, destroyed default group
        _side[key] = dist.new_group(backend="gloo")
    return _side[key]


def all_sum(*values: float) -> list[float]:
    """``values`` summed over every rank (float64); the values themselves without a process group."""
    t = torch.tensor(values, dtype=torch.float64)
    if dist.is_initialized():
        dist.all_reduce(t, group=host_group())
    return t.tolist()


def broadcast_from_rank0(obj: Any, rank: int) -> Any:
    """Rank 0's ``obj`` on every rank (pickled over the host group: learner-internal data only,
    never a request's)."""
    box = [obj if rank == 0 else None]
    if dist.is_initialized():
        dist.broadcast_object_list(box, src=0, group=host_group())
    return box[0]


def barrier() -> None:
    """Wait for every rank (a no-op without a process group)."""
    if dist.is_initialized():
        dist.barrier(group=host_group())
