"""Placement on node groups: custom Ray resources pin the learner and the replicas, the shm weight
path refuses a placement it cannot serve, and a CPU replica's engine is bound to its own cores.
(The end-to-end run across nodes is tests/e2e/test_grpo.py.)"""

from __future__ import annotations

import os

import pytest

from raypost.config import ConfigError, load_config
from raypost.config.grpo import GRPOConfig
from raypost.config.sections import ResourcesConfig
from raypost.config.serve import RolloutConfig

PINNED = [
    "--resources.ray_resources.learner_node",
    "1",
    "--rollout.ray_resources.rollout_node",
    "1",
    "--reward.ray_resources.reward_node",
    "0.5",
]


def test_ray_resources_name_custom_resources_only():
    assert ResourcesConfig(ray_resources={"learner_node": 1}).ray_resources == {"learner_node": 1.0}
    with pytest.raises(ValueError, match="'CPU' is not a custom resource: CPUs and GPUs have their own fields"):
        ResourcesConfig(ray_resources={"CPU": 1})
    with pytest.raises(ValueError, match=r"ray_resources.rollout_node = 0.0: amounts must be in \(0, 1e6\]"):
        RolloutConfig(ray_resources={"rollout_node": 0})
    with pytest.raises(ConfigError, match="did you mean 'rollout.ray_resources'"):
        load_config(GRPOConfig, ["--rollout.ray_resource.x", "1"])


def test_pinned_learner_replicas_and_reward_request_their_resources():
    from raypost.phases.grpo import placement_requests
    from raypost.serve.reward_app import build_app as reward_app
    from raypost.serve.rollout_app import build_app as rollout_app
    from raypost.train.trainer import learner_request, worker_resources

    cfg = load_config(GRPOConfig, [*PINNED, "--resources.num_workers", "2", "--rollout.num_replicas", "3"])
    assert worker_resources(cfg.resources) == {"CPU": cfg.resources.cpus_per_worker, "learner_node": 1.0}
    assert learner_request(cfg.resources)["learner_node"] == 2.0
    req = placement_requests(cfg)
    assert req["rollout (vLLM replicas)"]["rollout_node"] == 3.0 and req["reward (replicas)"]["reward_node"] == 0.5
    rollout = rollout_app("/m", cfg.rollout)._bound_deployment.ray_actor_options
    reward = reward_app(cfg.reward)._bound_deployment.ray_actor_options
    assert rollout["resources"] == {"rollout_node": 1.0} and reward["resources"] == {"reward_node": 0.5}
    plain = load_config(GRPOConfig, [])
    assert "resources" not in rollout_app("/m", plain.rollout)._bound_deployment.ray_actor_options


def _nodes(*resources: dict, alive: bool = True) -> list[dict]:
    return [{"NodeID": f"n{i}", "Alive": alive, "Resources": {"CPU": 2.0, **r}} for i, r in enumerate(resources)]


@pytest.mark.parametrize(
    "nodes, transport, shared, ok",
    [
        (_nodes({"learner_node": 4}, {"rollout_node": 4}), "shm", False, False),
        (_nodes({"learner_node": 4}, {"rollout_node": 4}), "object_store", False, True),
        (_nodes({"learner_node": 4}, {"rollout_node": 4}), "shm", True, True),  # a mount every node shares
        (_nodes({"learner_node": 4}, {"rollout_node": 4}, {"learner_node": 1, "rollout_node": 1}), "shm", False, True),
        (
            _nodes({"learner_node": 4, "rollout_node": 4}, alive=False) + _nodes({"learner_node": 4}),
            "shm",
            False,
            False,
        ),
    ],
    ids=["apart", "object_store", "shared_dir", "a_node_holds_both", "only_a_dead_node_holds_both"],
)
def test_shm_weights_need_a_node_that_can_hold_learner_and_replica(monkeypatch, nodes, transport, shared, ok):
    import ray

    from raypost.utils.cluster import ResourceError
    from raypost.weights import check_weight_path

    monkeypatch.setattr(ray, "nodes", lambda: nodes)
    rollout = RolloutConfig(weights={"transport": transport, **({"shared": shared} if transport == "shm" else {})})
    args = (rollout, {"CPU": 0.5, "learner_node": 1.0}, {"CPU": 1.0, "GPU": 0.0, "rollout_node": 1.0})
    if ok:
        check_weight_path(*args)
    else:
        with pytest.raises(ResourceError, match="Set rollout.weights.transport=object_store"):
            check_weight_path(*args)


def test_cpu_replica_engine_runs_in_one_process_bound_to_its_cores(monkeypatch):
    from raypost.serve import engine_env

    for key in (
        "VLLM_ENABLE_V1_MULTIPROCESSING",
        "OMP_PLACES",
        "OMP_NUM_THREADS",
        "OMP_PROC_BIND",
        "OMP_WAIT_POLICY",
        "VLLM_CPU_KVCACHE_SPACE",
    ):  # all restored after the test
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0-1,3")
    engine_env.cpu_engine_env(RolloutConfig())
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert (os.environ["OMP_PLACES"], os.environ["OMP_NUM_THREADS"], os.environ["OMP_PROC_BIND"]) == (
        "{0,1,3}",
        "3",
        "true",
    )
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    assert engine_env.replica_cores(RolloutConfig()) is None
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "auto")
    assert engine_env.replica_cores(RolloutConfig(cpu_bind=False)) is None


@pytest.mark.parametrize(
    "world, rank, cores, want", [(1, 0, [0, 1], [0, 1]), (2, 1, [0, 1, 2, 3], [2, 3]), (3, 2, [0, 1], [0])]
)
def test_replica_r_of_r_gets_its_own_cores(monkeypatch, world, rank, cores, want):
    from types import SimpleNamespace

    from raypost.serve import engine_env

    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    ctx = SimpleNamespace(world_size=world, rank=SimpleNamespace(local_rank=rank))
    monkeypatch.setattr(engine_env.serve, "get_replica_context", lambda: ctx)
    monkeypatch.setattr(engine_env.os, "sched_getaffinity", lambda _pid: set(cores))
    assert engine_env.replica_cores(RolloutConfig()) == want


def test_tensor_parallel_replicas_get_one_packed_placement_group():
    from raypost.serve.rollout_app import build_app

    with pytest.raises(ValueError, match="set rollout.gpus_per_replica to 2"):
        RolloutConfig(tensor_parallel_size=2)
    cfg = RolloutConfig(tensor_parallel_size=2, gpus_per_replica=2, ray_resources={"gpu_node": 1}, enforce_eager=False)
    d = build_app("/m", cfg)._bound_deployment
    assert d._replica_config.placement_group_bundles == [{"CPU": 1.0, "gpu_node": 1.0}, {"GPU": 1.0}, {"GPU": 1.0}]
    assert d._replica_config.placement_group_strategy == "STRICT_PACK"
    assert "num_gpus" not in d.ray_actor_options  # the engine's workers hold the GPUs, not the replica actor
    assert build_app("/m", RolloutConfig(gpus_per_replica=1))._bound_deployment.ray_actor_options["num_gpus"] == 1.0


def test_a_worker_or_replica_must_fit_on_one_node(monkeypatch):
    import ray

    from raypost.phases.grpo import check_placement
    from raypost.utils.cluster import ResourceError

    # 2 nodes with 2 GPUs each: 4 GPUs in all, but no node has the 4 that one replica needs.
    nodes = [{"NodeID": f"n{i}", "Alive": True, "Resources": {"CPU": 8.0, "GPU": 2.0}} for i in range(2)]
    monkeypatch.setattr(ray, "nodes", lambda: nodes)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 16.0, "GPU": 4.0})
    cfg = load_config(GRPOConfig, ["--rollout.tensor_parallel_size", "4", "--rollout.gpus_per_replica", "4"])
    with pytest.raises(
        ResourceError,
        match=r"no node of this cluster has \{'CPU': 0.5, 'GPU': 4.0\} for one rollout "
        r"replica \(rollout.cpus_per_replica, gpus_per_replica, ray_resources\)",
    ):
        check_placement(cfg)
    check_placement(load_config(GRPOConfig, ["--rollout.tensor_parallel_size", "2", "--rollout.gpus_per_replica", "2"]))
