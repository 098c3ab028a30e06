"""Joining Ray and checking that a placement fits before anything starts."""

from __future__ import annotations

import logging
import os
from typing import Mapping

import ray

log = logging.getLogger("raypost")


class ResourceError(RuntimeError):
    """The configured placement cannot fit on this cluster."""


def init_ray(address: str | None = None) -> None:
    """Join the job's cluster (``ray job submit`` sets RAY_ADDRESS) or start a local one."""
    configure_ray_data()
    if ray.is_initialized():
        return
    addr = address or os.environ.get("RAY_ADDRESS")
    # A local cluster stays on loopback (Ray would otherwise pick the first NIC's address). Its
    # dashboard serves the State API, which Ray Train's placement-group cleaner polls every second.
    kwargs = ({"include_dashboard": True, "dashboard_host": "127.0.0.1", "_node_ip_address": "127.0.0.1"}
              if addr is None else {})
    ray.init(address=addr, log_to_driver=True, **kwargs)


def configure_ray_data() -> None:
    """Ray Data settings for post-training data (thousands to millions of short rows):

    - the pull-based sort shuffle: the default hash shuffle starts up to 128 aggregator
      actors, which took minutes for a few thousand rows on a 2-core node;
    - no progress bars: raypost logs its own counts, and bars flood job logs.
    """
    import ray.data
    from ray.data.context import ShuffleStrategy

    ctx = ray.data.DataContext.get_current()
    ctx.shuffle_strategy = ShuffleStrategy.SORT_SHUFFLE_PULL_BASED
    ctx.enable_progress_bars = False
    ctx.enable_operator_progress_bars = False
    ctx.print_on_execution_start = False


def check_resources(requests: Mapping[str, Mapping[str, float]]) -> None:
    """Raise ResourceError unless the summed ``requests`` (label -> {resource: amount}) fit
    in the cluster's total resources. Labels name the config section to change."""
    total: dict[str, float] = {}
    for req in requests.values():
        for key, amount in req.items():
            total[key] = total.get(key, 0.0) + amount
    have = ray.cluster_resources()
    for key, need in total.items():
        if need > have.get(key, 0.0) + 1e-9:
            detail = ", ".join(f"{label} {req.get(key, 0):g}" for label, req in requests.items() if req.get(key))
            raise ResourceError(f"placement needs {need:g} {key} ({detail}) but the cluster has "
                                f"{have.get(key, 0.0):g}; lower those settings or add nodes")
