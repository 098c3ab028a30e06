"""Shipped Serve configs load: the serve-run YAML parses as Ray's schema and its apps build;
the CLI configs of both apps validate and reject bad keys."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from raypost.config import ConfigError

ROOT = Path(__file__).resolve().parents[2]


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
        RewardServiceConfig, ["--model", "/x/rm", "--port", "9000", "--token", "abcdefgh12345678"], aliases=ALIASES
    )
    assert cfg.model.path == "/x/rm" and cfg.port == 9000 and cfg.host == "127.0.0.1"
    assert cfg.auth_token.get_secret_value() == "abcdefgh12345678" and "abcdefgh" not in str(cfg)
    with pytest.raises(ConfigError, match="did you mean 'max_items'"):
        load_config(RewardServiceConfig, ["--max_itemz", "3"])


def test_rollout_cli_config():
    from raypost.config import load_config
    from serve_apps.rollout import RolloutAppConfig, _split

    cfg = load_config(RolloutAppConfig, ["--model", "/m", "--num_replicas", "2"])
    model, rollout, chan, token = _split(cfg)
    assert model == "/m" and rollout.num_replicas == 2 and cfg.host == "127.0.0.1" and token is None
    secret = load_config(RolloutAppConfig, ["--model", "/m", "--auth_token", "t" * 20])
    assert _split(secret)[3] == "t" * 20 and "t" * 20 not in str(secret)
    assert chan.transport == "shm" and chan.key == "rollout" and str(chan.dir) == "/dev/shm/raypost/rollout"
    with pytest.raises(ConfigError, match="config field 'model' is required: set it in the YAML or pass --model VALUE"):
        load_config(RolloutAppConfig, [])


def test_weight_transport_settings_are_one_section_per_transport():
    """``rollout.weights`` is a union told apart by ``transport``: each transport's own keys, a
    key of another transport refused by name, the nearest key suggested, shm by default."""
    import pickle

    from raypost.config import load_config
    from raypost.config.grpo import GRPOConfig
    from raypost.weights import open_channel

    cfg = load_config(GRPOConfig, ["--rollout.weights.transport", "collective", "--rollout.weight_bucket_mb", "8"])
    chan = open_channel(cfg.rollout, "run-a")
    assert (chan.transport, chan.key, chan.bucket_mb) == ("collective", "run-a", 8)
    again = pickle.loads(pickle.dumps(chan))  # crosses to the replicas and the learner as settings and names
    assert (type(again), again.key, again.settings) == (type(chan), "run-a", chan.settings)
    shm = load_config(GRPOConfig, ["--rollout.weights.dir", "/mnt/shared", "--rollout.weights.shared", "true"])
    assert shm.rollout.weights.transport == "shm" and shm.rollout.weights.shared
    assert str(open_channel(shm.rollout, "r").dir) == "/mnt/shared/r"
    with pytest.raises(ConfigError, match=r"unknown config key 'rollout.weights.dir'"):
        load_config(GRPOConfig, ["--rollout.weights.transport", "object_store", "--rollout.weights.dir", "/x"])
    with pytest.raises(ConfigError, match=r"did you mean 'rollout.weights.shared'\?"):
        load_config(GRPOConfig, ["--rollout.weights.sharde", "true"])
    with pytest.raises(ConfigError, match=r"rollout.weights"):
        load_config(GRPOConfig, ["--rollout.weights.transport", "carrier_pigeon"])
