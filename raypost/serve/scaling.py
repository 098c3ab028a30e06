"""Live scaling of the rollout replicas: Serve autoscaling on queue depth, with an operator
override that a CLI sets while a run goes on.

The rollout deployment's autoscaling policy is ``rollout_policy``: it runs in the Serve
controller and returns the replica count that an operator pinned in Ray's internal KV, or
else Serve's own queue-length policy. Serve then adds or removes replicas; the run does not
stop. A new replica loads the latest pushed weight version before it serves.

  python -m raypost.serve.scaling --replicas 2     # pin 2 replicas (within min/max)
  python -m raypost.serve.scaling --auto           # back to queue-depth autoscaling
  python -m raypost.serve.scaling                  # show the pinned count and live replicas
(RAY_ADDRESS names the cluster; --app names the run's rollout app, "<run name>-rollout".)
"""

from __future__ import annotations

import argparse
import math
from typing import Any

KV_NAMESPACE = "raypost"


def override_key(app_name: str) -> bytes:
    return f"replicas/{app_name}".encode()


def pinned_replicas(app_name: str) -> int | None:
    """The operator's pinned replica count for ``app_name``, if any (needs a Ray connection)."""
    from ray.experimental.internal_kv import _internal_kv_get

    raw = _internal_kv_get(override_key(app_name), namespace=KV_NAMESPACE)
    return int(raw) if raw else None


def pin_replicas(app_name: str, replicas: int | None) -> None:
    """Pin ``replicas`` for ``app_name``, or clear the pin (None)."""
    from ray.experimental.internal_kv import _internal_kv_del, _internal_kv_put

    if replicas is None:
        _internal_kv_del(override_key(app_name), namespace=KV_NAMESPACE)
    else:
        _internal_kv_put(override_key(app_name), str(replicas).encode(), overwrite=True, namespace=KV_NAMESPACE)


def rollout_policy(ctx: Any) -> tuple[float, dict[str, Any]]:
    """Serve autoscaling policy: the pinned count, else queue depth (ongoing requests over
    ``target_ongoing_requests`` per replica). Serve applies min/max and the delays."""
    pinned = pinned_replicas(ctx.app_name or "")
    if pinned is not None:
        return pinned, {}
    if ctx.current_num_replicas == 0:
        return ctx.target_num_replicas, {}
    return math.ceil(ctx.total_num_requests / ctx.config.get_target_ongoing_requests()), {}


def autoscaling_config(
    min_replicas: int,
    max_replicas: int,
    target_ongoing_requests: float,
    upscale_delay_s: float,
    downscale_delay_s: float,
) -> dict[str, Any]:
    """Serve ``autoscaling_config`` for the rollout deployment, with ``rollout_policy``."""
    return {
        "min_replicas": min_replicas,
        "initial_replicas": min_replicas,
        "max_replicas": max_replicas,
        "target_ongoing_requests": target_ongoing_requests,
        "upscale_delay_s": upscale_delay_s,
        "downscale_delay_s": downscale_delay_s,
        "metrics_interval_s": 1.0,
        "look_back_period_s": 5.0,
        "policy": {"policy_function": "raypost.serve.scaling:rollout_policy"},
    }


def live_replicas(app_name: str) -> dict[str, int]:
    """Running replicas per deployment of ``app_name``."""
    from ray import serve

    app = serve.status().applications.get(app_name)
    if app is None:
        return {}
    return {name: d.replica_states.get("RUNNING", 0) for name, d in app.deployments.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--app", required=True, help="the run's rollout app: <run name>-rollout")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--replicas", type=int, help="pin this many replicas (within the app's min/max)")
    group.add_argument("--auto", action="store_true", help="clear the pin: queue-depth autoscaling")
    args = parser.parse_args(argv)
    if args.replicas is not None and args.replicas < 1:
        parser.error(f"--replicas must be >= 1, got {args.replicas}")

    import ray

    ray.init(log_to_driver=False)
    if args.replicas is not None or args.auto:
        pin_replicas(args.app, None if args.auto else args.replicas)
    print(f"app {args.app}: pinned={pinned_replicas(args.app)} running={live_replicas(args.app)}", flush=True)


if __name__ == "__main__":
    main()
