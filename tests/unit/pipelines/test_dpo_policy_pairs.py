"""DPO with pairs from the policy: the config refuses given pairs, and the job reserves the larger
of its two phases (sampling on Serve, then the learner), which run in turn."""

from __future__ import annotations

import pytest

from raypost.config import load_config
from raypost.config.base import ConfigError
from raypost.config.dpo import DPOConfig
from raypost.pipelines.dpo import requests


def test_policy_pairs_refuse_given_pairs_naming_both_settings():
    with pytest.raises((ConfigError, ValueError), match="pairs.build true .* policy_pairs.enabled false"):
        load_config(DPOConfig, ["--policy_pairs.enabled", "true", "--pairs.build", "false"])


def test_the_job_reserves_the_larger_of_its_phases():
    learner = ["--resources.num_workers", "2", "--resources.cpus_per_worker", "1"]
    assert requests(load_config(DPOConfig, learner)) == {"resources (learner)": {"CPU": 2.0}}
    small = load_config(DPOConfig, [*learner, "--policy_pairs.enabled", "true", "--rollout.cpus_per_replica", "0.5"])
    assert list(requests(small)) == ["resources (learner)"]  # 2 CPUs against 0.5 + 0.25 + 0.1
    big = load_config(DPOConfig, [*learner, "--policy_pairs.enabled", "true", "--rollout.num_replicas", "3"])
    held = requests(big)
    assert held["rollout (vLLM replicas)"]["CPU"] == 3.0 and held["reward (replicas)"]["CPU"] == 0.25
    assert held["policy_pairs (Ray Data actors)"]["CPU"] == pytest.approx(0.1)
    gpus = load_config(DPOConfig, [*learner, "--policy_pairs.enabled", "true", "--rollout.gpus_per_replica", "1"])
    on_gpus = requests(gpus.model_copy(update={"rollout": gpus.rollout.model_copy(update={"num_replicas": 2})}))
    assert on_gpus["rollout (vLLM replicas)"]["GPU"] == 2.0  # GPUs outweigh the learner's CPUs
