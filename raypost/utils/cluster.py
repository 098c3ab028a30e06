"""Joining Ray and checking that a placement fits before anything starts."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import ray

from raypost.config.base import ConfigError

log = logging.getLogger("raypost")


class ResourceError(ConfigError):
    """The configured placement cannot fit on this cluster (pipelines print it as a config error)."""


def init_ray(address: str | None = None) -> None:
    """Join the job's cluster (``ray job submit`` sets RAY_ADDRESS) or start a local one."""
    configure_ray_data()
    if ray.is_initialized():
        return
    addr = address or os.environ.get("RAY_ADDRESS")
    # A local cluster stays on loopback (Ray would otherwise pick the first NIC's address). Its
    # dashboard serves the State API, which Ray Train's placement-group cleaner polls every second.
    kwargs = (
        {"include_dashboard": True, "dashboard_host": "127.0.0.1", "_node_ip_address": "127.0.0.1"}
        if addr is None
        else {}
    )
    ray.init(address=addr, log_to_driver=True, **kwargs)


def started_here() -> bool:
    """Whether this process started the Ray instance it is on (a local one, which ends with the
    process), not joined a cluster. False when it cannot tell."""
    try:
        return bool(ray._private.worker.global_worker.node.head)
    except Exception:  # noqa: BLE001 - a private attribute: on any change, say "joined"
        return False


def configure_ray_data() -> None:
    """Ray Data settings for post-training data (thousands to millions of short rows):

    - the pull-based sort shuffle: the default hash shuffle starts up to 128 aggregator
      actors, which took minutes for a few thousand rows on a 2-core node;
    - no progress bars: raypost logs its own counts, and bars flood job logs;
    - blocks in input order: a run resumes from a row cursor into a seeded shuffle of its
      prepared rows, so that order must not depend on which block a busy node finished first
      (without it, 6 of a resumed GRPO run's 48 prompts were ones trained before).
    """
    import ray.data
    from ray.data.context import ShuffleStrategy

    ctx = ray.data.DataContext.get_current()
    ctx.shuffle_strategy = ShuffleStrategy.SORT_SHUFFLE_PULL_BASED
    ctx.enable_progress_bars = False
    ctx.enable_operator_progress_bars = False
    ctx.print_on_execution_start = False
    ctx.execution_options.preserve_order = True


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
            raise ResourceError(
                f"placement needs {need:g} {key} ({detail}) but the cluster has "
                f"{have.get(key, 0.0):g}; lower those settings or add nodes"
            )


def nodes_that_fit(request: Mapping[str, float]) -> set[str]:
    """Ids of the alive nodes whose total resources could hold ``request`` (one actor or worker)."""
    return {
        n["NodeID"]
        for n in ray.nodes()
        if n["Alive"] and all(n["Resources"].get(k, 0.0) >= v - 1e-9 for k, v in request.items() if v)
    }


def check_one_node(request: Mapping[str, float], what: str) -> None:
    """Raise ResourceError when no alive node could hold ``request`` whole: one learner worker or
    one replica (with all its tensor-parallel GPUs) runs on one node. ``what`` names the settings."""
    if not nodes_that_fit(request):
        shown = {k: v for k, v in request.items() if v}
        raise ResourceError(
            f"no node of this cluster has {shown} for one {what}; lower those settings or add a node that large"
        )


def check_same_node_possible(learner: Mapping[str, float], replicas: Mapping[str, float], why: str) -> None:
    """Raise ResourceError when no node could hold a learner worker and ``replicas`` (what every
    replica that must share its node asks for, summed) at once: ``why`` says what needs them
    together and how to avoid it."""
    both = {k: learner.get(k, 0.0) + replicas.get(k, 0.0) for k in {*learner, *replicas}}
    if not nodes_that_fit(both):
        shown = [{k: v for k, v in r.items() if v} for r in (learner, replicas, both)]
        raise ResourceError(
            f"no node can hold a learner worker ({shown[0]}) and the rollout replicas ({shown[1]}) together "
            f"({shown[2]}): {why}"
        )


def alive_nodes() -> int:
    return sum(1 for n in ray.nodes() if n["Alive"])


def actor_table(job_id: str | None = None) -> list[dict[str, Any]]:
    """The GCS actor table (``ActorTableData``, which unlike the State API has ``max_restarts``),
    optionally of one job (hex id): class, state, death reason, restart budget, and whether the
    GCS would keep the actor for a restart (``restartable``)."""
    from ray._private.state import state
    from ray.core.generated import common_pb2, gcs_pb2

    rows = []
    for raw in state._connect_and_get_accessor().get_actor_table(None, None):
        actor = gcs_pb2.ActorTableData.FromString(raw)
        if job_id is not None and actor.job_id.hex() != job_id:
            continue
        reason = actor.death_cause.actor_died_error_context.reason
        restarts = actor.num_restarts - actor.num_restarts_due_to_node_preemption
        dead = actor.state == gcs_pb2.ActorTableData.DEAD
        rows.append(
            {
                "actor_id": actor.actor_id.hex(),
                "class_name": actor.class_name,
                "job_id": actor.job_id.hex(),
                "state": gcs_pb2.ActorTableData.ActorState.Name(actor.state),
                "death_reason": common_pb2.ActorDiedErrorContext.Reason.Name(reason) if dead else None,
                "max_restarts": actor.max_restarts,
                "num_restarts": actor.num_restarts,
                "restartable": dead
                and reason == common_pb2.ActorDiedErrorContext.OUT_OF_SCOPE
                and (
                    actor.max_restarts == -1
                    or restarts < actor.max_restarts
                    or (actor.max_restarts > 0 and actor.preempted)
                ),
            }
        )
    return rows


def restartable_dead_actors(job_id: str | None = None) -> list[dict[str, Any]]:
    """Actors the GCS keeps as DEAD (out of scope) but restartable: dropped by handle while
    objects they made are still referenced, kept for lineage reconstruction. After a head crash a
    GCS that reloads such an actor from Redis aborts (docs/recovery.md), so raypost leaves none."""
    return [a for a in actor_table(job_id) if a["restartable"]]
