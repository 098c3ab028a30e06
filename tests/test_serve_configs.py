"""Shipped Serve configs load: the serve-run YAML parses as Ray's schema and its apps build;
the CLI configs of both apps validate and reject bad keys."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from raypost.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("path", sorted((ROOT / "serve_apps").glob("*.yaml")), ids=lambda p: p.name)
def test_serve_yaml_loads_and_builds(path):
    import importlib

    from ray import serve
    from ray.serve.schema import ServeDeploySchema

    from serve_apps.reward import config_from_args

    schema = ServeDeploySchema.model_validate(yaml.safe_load(path.read_text()))
    assert schema.http_options.host == "127.0.0.1"
    for app in schema.applications:
        module, _, attr = app.import_path.partition(":")
        built = getattr(importlib.import_module(module), attr)(app.args or {})
        assert isinstance(built, serve.Application)
        # the deployment is bound to the config the YAML's args describe, on Serve's port
        cfg = config_from_args(app.args or {})
        deployment = built._bound_deployment
        assert deployment.init_args[0] == cfg.model_dump(mode="json")
        assert deployment.ray_actor_options["num_cpus"] == cfg.cpus_per_replica
        assert cfg.port == schema.http_options.port and cfg.host == schema.http_options.host


def test_reward_cli_config():
    from raypost.config import load_config
    from raypost.config.serve import RewardServiceConfig
    from serve_apps.reward import ALIASES

    cfg = load_config(
        RewardServiceConfig, ["--model", "/x/rm", "--port", "9000", "--token", "abcdefgh1"], aliases=ALIASES
    )
    assert cfg.model.path == "/x/rm" and cfg.port == 9000 and cfg.auth_token == "abcdefgh1" and cfg.host == "127.0.0.1"
    with pytest.raises(ConfigError, match="did you mean 'max_items'"):
        load_config(RewardServiceConfig, ["--max_itemz", "3"])


def test_rollout_cli_config():
    from raypost.config import load_config
    from serve_apps.rollout import RolloutAppConfig, _split

    cfg = load_config(RolloutAppConfig, ["--model", "/m", "--num_replicas", "2"])
    model, rollout = _split(cfg)
    assert model == "/m" and rollout.num_replicas == 2 and cfg.host == "127.0.0.1"
    with pytest.raises(ConfigError, match="config field 'model' is required: set it in the YAML or pass --model VALUE"):
        load_config(RolloutAppConfig, [])
