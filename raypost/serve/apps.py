"""The one Serve lifecycle every raypost caller uses: deploy a job's apps, yield, delete them.

Serve apps outlive jobs and hold their replicas' CPUs and GPUs, so every app a job deploys is
deleted when the job's block ends, also on error. Apps of the same name left by an earlier job
that died are deleted first, so fresh replicas start from the model given here. Inside a
placement group (a Tune trial), the apps are deployed from a task scheduled outside it: Serve's
controller and replicas do not fit in the trial's group.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from raypost.config.serve import RolloutConfig
from raypost.serve.rollout_client import RolloutClient
from raypost.weights import WeightChannel

log = logging.getLogger("raypost")


@dataclass(frozen=True)
class App:
    """One Serve app: its name, a builder of its ``serve.Application``, and its HTTP route
    (None: reachable by handle only)."""

    name: str
    build: Callable[[], Any]
    route_prefix: str | None = None


def _start(host: str, port: int) -> None:
    from ray import serve

    # Serve is cluster-wide and keeps the HTTP options it first started with; every raypost app
    # starts it the same way (loopback unless configured). A no-op if Serve already runs.
    serve.start(http_options={"host": host, "port": port})


def _deploy(apps: Sequence[App], host: str, port: int) -> None:
    from ray import serve
    from ray.serve.api import RunTarget

    _start(host, port)
    stale = [a.name for a in apps if a.name in serve.status().applications]
    for name in stale:
        serve.delete(name)
    serve.run_many([RunTarget(a.build(), name=a.name, route_prefix=a.route_prefix) for a in apps])


def _outside_group(fn: Callable[..., None], *args: Any) -> None:
    """``fn(*args)`` here, or in a task outside the caller's placement group if it has one (a
    Tune trial): Serve's controller, proxy and replicas do not fit in the trial's group."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    if ray.get_runtime_context().get_placement_group_id() is None:
        fn(*args)
        return
    outside = PlacementGroupSchedulingStrategy(placement_group=None)
    ray.get(ray.remote(num_cpus=0, scheduling_strategy=outside)(fn).remote(*args))


def start(host: str = "127.0.0.1", port: int = 8000) -> None:
    """Start Serve (its controller and HTTP proxy) unless it runs; ``deploy`` does it too. A job
    calls it early, on a thread, so that Serve's start-up overlaps its data preparation."""
    _outside_group(_start, host, port)


def deploy(apps: Sequence[App], host: str = "127.0.0.1", port: int = 8000) -> None:
    """Deploy ``apps`` at once (from outside the caller's placement group, if it has one)."""
    _outside_group(_deploy, apps, host, port)


def delete(names: Sequence[str], timeout_s: float = 120.0, wait: bool = True) -> None:
    """Delete the apps ``names`` together (their replicas shut down at once, not one app after
    the other) and wait, for at most ``timeout_s``, until Serve no longer lists them (``wait``
    False: a job's last step on the Ray instance it started, which ends with it)."""
    import time

    from ray import serve

    for name in names:
        try:
            serve.delete(name, _blocking=False)
        except Exception as err:  # noqa: BLE001 - cleanup after a failure must not hide that failure
            log.warning("could not delete the Serve app %r: %s", name, err)
    if not wait:
        return
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            left = sorted(set(names) & set(serve.status().applications))
        except Exception as err:  # noqa: BLE001 - as above
            log.warning("could not check that the Serve apps %s are gone: %s", list(names), err)
            return
        if not left:
            return
        if time.monotonic() > deadline:
            log.warning("the Serve apps %s were still shutting down after %.0f s", left, timeout_s)
            return
        time.sleep(0.2)


@contextlib.contextmanager
def deployed(
    apps: Sequence[App], host: str = "127.0.0.1", port: int = 8000, cleanup: Callable[[], None] | None = None
) -> Iterator[None]:
    """Deploy ``apps``, yield, then delete them and call ``cleanup`` (also on error)."""
    try:
        deploy(apps, host, port)
        yield
    finally:
        delete([a.name for a in apps])
        if cleanup is not None:
            cleanup()


def rollout(
    name: str,
    model_path: str,
    cfg: RolloutConfig,
    channel: WeightChannel | None = None,
    route_prefix: str | None = None,
) -> App:
    """A rollout app (vLLM replicas as ``cfg`` says) serving ``model_path``, and the versions
    pushed through ``channel`` (None: the model as loaded)."""

    def build() -> Any:
        from raypost.serve.rollout_app import build_app

        return build_app(model_path, cfg, channel)

    return App(name, build, route_prefix)


@contextlib.contextmanager
def served(model_path: str, cfg: RolloutConfig, app: str, chunk: int = 16) -> Iterator[RolloutClient]:
    """A model served for one job: seq-KD's teacher answering the training prompts, or held-out
    evaluation through vLLM (``eval.engine: vllm``). Yields a client; no weights are pushed, so
    the replicas serve the model as loaded (no weight channel)."""
    with deployed([rollout(app, model_path, cfg)]):
        yield RolloutClient.of(app, None, cfg, chunk)
