"""A model served for one job and removed after it: seq-KD's teacher answering the training
prompts, or held-out evaluation of a real model through vLLM (``eval.engine: vllm``)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

from raypost.config.serve import RolloutConfig
from raypost.serve.rollout_client import RolloutClient


@contextlib.contextmanager
def served(model_path: str, cfg: RolloutConfig, app: str, scratch: Path, chunk: int = 16) -> Iterator[RolloutClient]:
    """Deploy ``model_path`` as the rollout app ``app`` (replicas as ``cfg`` says), yield a client,
    and delete the app afterwards, also on error. No weights are pushed: the replicas serve the
    model as loaded (``scratch/<app>_weights`` stays empty)."""
    from ray import serve

    from raypost.serve.rollout_app import build_app

    weights_dir = scratch / f"{app}_weights"
    weights_dir.mkdir(parents=True, exist_ok=True)
    # Serve is cluster-wide and keeps the options it first started with: start it as every raypost
    # app does (HTTP on loopback) if it is not running; a disabled proxy would break HTTP apps later.
    serve.start(http_options={"host": "127.0.0.1"})
    serve.run(build_app(model_path, cfg.model_copy(update={"weights_dir": str(weights_dir)})), name=app,
              route_prefix=None)
    try:
        yield RolloutClient(app, str(weights_dir), cfg.max_attempts, chunk=chunk, transport=cfg.weight_transport)
    finally:
        serve.delete(app)
