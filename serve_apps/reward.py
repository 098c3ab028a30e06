"""The reward service on Ray Serve: verifiers + optional reward model, HTTP + handle.

Standalone:
  python serve_apps/reward.py [--model PATH] [--port 8000] [--host 127.0.0.1] [--config FILE]
                              [--auth_token TOKEN] [--rewards.0.weight 1.0 ...]
With `serve run` (config file in serve_apps/reward_serve.yaml, or arguments):
  serve run serve_apps.reward:app_builder model.path=PATH port=8000
Binds 127.0.0.1 unless --host says otherwise. Bearer token: --auth_token or RAYPOST_REWARD_TOKEN.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from raypost.config import ConfigError, build, load_config  # noqa: E402
from raypost.config.base import deep_merge, parse_overrides  # noqa: E402
from raypost.config.serve import RewardServiceConfig  # noqa: E402

ALIASES = {"model": "model.path", "token": "auth_token"}


def config_from_args(args: dict[str, Any]) -> RewardServiceConfig:
    """The validated config of ``serve run`` / serveConfigV2 ``args`` (dotted keys allowed)."""
    argv = [x for k, v in args.items() for x in (f"--{k}", str(v))]
    _, overrides = parse_overrides(argv, ALIASES)
    return build(RewardServiceConfig, deep_merge({}, overrides))


def app_builder(args: dict[str, Any]):
    """``serve run serve_apps.reward:app_builder key=value ...`` (dotted keys allowed)."""
    from raypost.serve.reward_app import build_app

    return build_app(config_from_args(args))


def main(argv: list[str]) -> None:
    cfg = load_config(RewardServiceConfig, argv, aliases=ALIASES)

    from raypost.serve.reward_app import build_app
    from raypost.serve.standalone import serve_forever

    serve_forever(build_app(cfg), "reward", cfg.host, cfg.port, cfg.route_prefix, "reward service")


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except ConfigError as err:
        sys.exit(f"raypost: {err}")
