"""Serve apps on their own: the reward service and the vLLM rollout replicas.

``raypost serve-reward`` / ``raypost serve-rollout`` run one until Ctrl-C (127.0.0.1 unless
--host says otherwise). Each takes a bearer token from its environment (RAYPOST_REWARD_TOKEN,
RAYPOST_ROLLOUT_TOKEN) or from --auth_token (seen by ps: prefer the environment). With
``serve run`` or a serveConfigV2 (KubeRay), the builders take dotted keys:
``serve run raypost.serve.entry:reward_app model.path=PATH port=8000``.
Rollout weights are pushed through the app's weight channel (``raypost.weights``, named by
``weights_key``): every replica, new or restarted, serves the latest version.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from raypost.config import build, load_config
from raypost.config.base import Secret, deep_merge, parse_overrides
from raypost.config.serve import RewardServiceConfig, RolloutConfig

REWARD_ALIASES = {"model": "model.path", "token": "auth_token"}


def config_from_args(args: dict[str, Any]) -> RewardServiceConfig:
    """The validated config of ``serve run`` / serveConfigV2 ``args`` (dotted keys allowed)."""
    argv = [x for k, v in args.items() for x in (f"--{k}", str(v))]
    _, overrides = parse_overrides(argv, REWARD_ALIASES)
    return build(RewardServiceConfig, deep_merge({}, overrides))


def reward_app(args: dict[str, Any]):
    """``serve run raypost.serve.entry:reward_app key=value ...`` (dotted keys allowed)."""
    from raypost.serve.reward_app import build_app

    return build_app(config_from_args(args))


def reward_main(argv: list[str]) -> None:
    cfg = load_config(RewardServiceConfig, argv, aliases=REWARD_ALIASES)

    from raypost.serve.reward_app import build_app
    from raypost.serve.standalone import serve_forever

    serve_forever(build_app(cfg), "reward", cfg.host, cfg.port, cfg.route_prefix, "reward service")


class RolloutAppConfig(RolloutConfig):
    """The rollout app on its own: which model, and where HTTP listens."""

    model: str = Field(..., min_length=1, description="HF model path or id served by the replicas.")
    host: str = Field("127.0.0.1", min_length=1, description="HTTP bind address.")
    port: int = Field(8001, ge=1, le=65535, description="HTTP port.")
    auth_token: Secret | None = Field(
        None,
        description="Bearer token required on HTTP. Prefer the RAYPOST_ROLLOUT_TOKEN environment variable: "
        "a token on the command line is seen by ps and job logs.",
    )
    weights_key: str = Field(
        "rollout",
        min_length=1,
        description="The run name a learner publishes weight versions under: "
        "raypost.weights.open_channel(rollout config, weights_key).publish(version, state_dict).",
    )


def _split(cfg: RolloutAppConfig) -> tuple[str, RolloutConfig, Any, str | None]:
    from raypost.weights import open_channel

    own = {"model", "host", "port", "weights_key", "auth_token"}
    rollout = RolloutConfig.model_validate(cfg.model_dump(exclude=own))
    token = cfg.auth_token.get_secret_value() if cfg.auth_token is not None else None
    return cfg.model, rollout, open_channel(rollout, cfg.weights_key), token


def rollout_app(args: dict[str, Any]):
    """``serve run raypost.serve.entry:rollout_app model=PATH key=value ...``."""
    from raypost.serve.rollout_app import build_app

    _, overrides = parse_overrides([x for k, v in args.items() for x in (f"--{k}", str(v))])
    return build_app(*_split(build(RolloutAppConfig, overrides)))


def rollout_main(argv: list[str]) -> None:
    cfg = load_config(RolloutAppConfig, argv)

    from raypost.serve.rollout_app import build_app
    from raypost.serve.standalone import serve_forever

    serve_forever(build_app(*_split(cfg)), "rollout", cfg.host, cfg.port, "/", "rollout replicas (/v1/completions)")
