"""Safe by default (issue 43): config that would fail later is refused up front, secrets never
reach a run's files, weight files are the run user's only, and the collective weight server
serves no one without the run's token."""

from __future__ import annotations

import json
import os
import stat
from datetime import timedelta
from pathlib import Path

import pytest
import torch

from raypost.config import build, dump_yaml
from raypost.config.base import ConfigError
from raypost.config.grpo import GRPOConfig
from raypost.config.serve import RewardServiceConfig, RolloutConfig

SECRET = "0123456789abcdef-secret"


# The config boundary: (pipeline config class, overrides, what the error says).
REFUSED = [
    (GRPOConfig, {"optim": {"grad_accum": 4}}, "optim.grad_accum 4 is not used by GRPO"),
    (GRPOConfig, {"data": {"max_seq_len": 600}}, "data.max_seq_len 600 exceeds rollout.max_model_len 512"),
    (GRPOConfig, {"run": {"storage_path": f"s3://AKIAX:{SECRET}@bucket/runs"}}, "AWS_SECRET_ACCESS_KEY"),
    (GRPOConfig, {"run": {"storage_path": f"s3://b/runs?secret_key={SECRET}"}}, "carries credentials (secret_key)"),
    (GRPOConfig, {"data": {"path": f"gs://u:{SECRET}@b/x.jsonl"}}, "GOOGLE_APPLICATION_CREDENTIALS"),
    (RewardServiceConfig, {"auth_token": "short"}, "at least 16 characters"),
]


@pytest.mark.parametrize("model,overrides,needle", REFUSED, ids=[n for *_, n in REFUSED])
def test_config_that_would_fail_later_or_leak_is_refused(model, overrides, needle):
    with pytest.raises(ConfigError) as err:
        build(model, overrides)
    assert needle in str(err.value) and SECRET not in str(err.value) and "short" not in str(err.value)


def test_secrets_are_never_written_to_run_files(tmp_path: Path):
    cfg = build(GRPOConfig, {"reward": {"auth_token": SECRET}})
    assert cfg.reward.auth_token.get_secret_value() == SECRET
    dump_yaml(cfg, tmp_path / "config.yaml")
    text = (tmp_path / "config.yaml").read_text() + json.dumps(cfg.model_dump(mode="json")) + str(cfg) + repr(cfg)
    assert SECRET not in text
    reloaded = build(GRPOConfig, __import__("yaml").safe_load((tmp_path / "config.yaml").read_text()))
    assert reloaded.reward.auth_token is None  # a reloaded config takes it from RAYPOST_REWARD_TOKEN


def test_weight_files_and_their_folder_are_the_run_users_only(tmp_path: Path):
    from raypost.weights import specs_of
    from raypost.weights.shm import VersionFiles

    state = {"w": torch.arange(4.0)}
    path = VersionFiles(tmp_path / "run").write(1, specs_of(state), [state])
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "run").st_mode) == 0o700


def test_the_weight_server_refuses_a_client_without_the_token():
    import torch.distributed as dist

    from raypost.weights import specs_of
    from raypost.weights.collective import WeightServer, receive, request

    server = WeightServer("127.0.0.1", timeout_s=3.0, ticket_wait_s=0.5)
    state = {"w": torch.arange(6.0)}
    try:
        server.offer(3, specs_of(state), [state])
        intruder = dist.TCPStore("127.0.0.1", server.address["port"], is_master=False, timeout=timedelta(seconds=5))
        ticket = intruder.add("ticket", 1)
        intruder.set(f"req/{ticket}", json.dumps({"workers": 1}))  # no proof of the token
        stolen = {**server.address, "token": "guessed"}
        with pytest.raises(RuntimeError):  # a wrong token: never answered (its own timeout)
            request(stolen, workers=1, timeout_s=2.0)
        src = request(server.address, workers=1)  # the run's replica still gets its weights
        assert src["version"] == 3 and torch.equal(dict(receive(src, 0))["w"], state["w"])
        refused = [r for r in server.sent if r.get("error", "").startswith("refused")]
        assert len(refused) == 2 and not intruder.check([f"g{ticket}/offer"])
    finally:
        server.stop()


def _nodes(*cpus: float) -> list[dict]:
    return [{"NodeID": f"n{i}", "Alive": True, "Resources": {"CPU": c}} for i, c in enumerate(cpus)]


@pytest.mark.parametrize(
    "nodes,replicas,ok",
    [
        (_nodes(2.0, 2.0), 1, False),  # each fits on a node, both together fit on none
        (_nodes(3.0, 2.0), 1, True),
        (_nodes(3.0, 4.0), 2, False),  # shm: every replica on rank 0's node, so 1 + 2 x 2
        (_nodes(5.0), 2, True),
    ],
)
def test_shm_needs_one_node_for_the_learner_and_its_replicas_summed(monkeypatch, nodes, replicas, ok):
    import ray

    from raypost.utils.cluster import ResourceError
    from raypost.weights import check_weight_path

    monkeypatch.setattr(ray, "nodes", lambda: nodes)
    rollout = RolloutConfig(num_replicas=replicas, weights={"transport": "shm"})
    args = (rollout, {"CPU": 1.0}, {"CPU": 2.0})
    if ok:
        check_weight_path(*args)
    else:
        with pytest.raises(ResourceError, match="together"):
            check_weight_path(*args)


@pytest.mark.parametrize(
    "nodes,given,expected",
    [(1, None, "shm"), (3, None, "object_store"), (3, "shm", "shm"), (1, "collective", "collective")],
)
def test_the_default_transport_reaches_every_node(monkeypatch, nodes, given, expected):
    import ray

    from raypost.weights import default_transport

    monkeypatch.setattr(ray, "nodes", lambda: _nodes(*[4.0] * nodes))
    rollout = RolloutConfig(**({"weights": {"transport": given}} if given else {}))
    default_transport(rollout)
    assert rollout.weights.transport == expected


def test_a_missing_data_file_fails_before_ray_starts(monkeypatch, tmp_path: Path):
    from raypost.phases import data as data_phase
    from raypost.utils import cluster

    def no_ray(*_a, **_k):
        raise AssertionError("Ray was started before the inputs were checked")

    monkeypatch.setattr(cluster, "init_ray", no_ray)
    cfg = build(GRPOConfig, {"data": {"path": str(tmp_path / "missing.jsonl")}, "run": {"storage_path": str(tmp_path)}})
    with pytest.raises(ConfigError, match="data.path: .*missing.jsonl' does not exist"):
        data_phase.start_run(cfg)
    assert not (tmp_path / cfg.run.name).exists()


def test_a_training_runs_rollout_app_has_no_http_route():
    from raypost.phases.grpo import apps

    rollout, reward = apps(build(GRPOConfig, {"run": {"name": "r1"}}), "/m")
    assert (rollout.name, rollout.route_prefix) == ("r1-rollout", None)
    assert (reward.name, reward.route_prefix) == ("r1-reward", "/r1/reward")


def test_a_sweep_over_a_missing_data_file_fails_before_ray_starts(monkeypatch, tmp_path: Path):
    import yaml

    from raypost.tune.command import main as tune_main
    from raypost.utils import cluster

    monkeypatch.setattr(
        cluster, "init_ray", lambda *a, **k: pytest.fail("Ray was started before the inputs were checked")
    )
    space = yaml.safe_load((Path(__file__).parents[2] / "tune_spaces" / "sft_quick.yaml").read_text())
    space["base"]["data"] = {"path": str(tmp_path / "gone.jsonl")}
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    with pytest.raises(ConfigError, match="gone.jsonl' does not exist"):
        tune_main(["--pipeline", "sft", "--space", str(tmp_path / "space.yaml"), "--storage", str(tmp_path)])
