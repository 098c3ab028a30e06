"""Config of the pass-rate pass before RL: sample the policy, score, keep a band, order the prompts."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from raypost.config.base import StrictModel


class PassRateConfig(StrictModel):
    """Before RL, a Ray Data pass samples ``samples`` completions of each training prompt on the
    run's rollout replicas (the policy entering RL), scores them on its reward app, and keeps the
    prompts whose pass rate lies strictly between ``min_pass_rate`` and ``max_pass_rate`` (as
    Polaris, DAPO and Skywork filter offline). A prompt no sample solves gives GRPO a group of
    equal rewards and nothing to learn; one every sample solves, the same. ``order: easy_first``
    is a curriculum: the kept prompts from the highest pass rate to the lowest."""

    enabled: bool = Field(False, description="Run the pass before RL (off: every training prompt, shuffled).")
    samples: int = Field(8, ge=2, le=256, description="k: completions sampled per prompt to estimate its pass rate.")
    pass_reward: float = Field(
        1.0, ge=-1e6, le=1e6, description="A sample passes when its total reward is at least this (accuracy: 1.0)."
    )
    min_pass_rate: float = Field(
        0.0, ge=0.0, lt=1.0, description="Keep prompts whose pass rate is above this (0: drop those nothing solved)."
    )
    max_pass_rate: float = Field(
        1.0, gt=0.0, le=1.0, description="Keep prompts whose pass rate is below this (1: drop those all solved)."
    )
    max_prompts: int | None = Field(
        None, ge=1, le=100_000_000, description="Score at most this many training prompts (seeded pick; None: all)."
    )
    order: Literal["shuffle", "easy_first"] = Field(
        "shuffle", description="shuffle: seeded epochs as without the pass; easy_first: highest pass rate first."
    )
    temperature: float = Field(1.0, gt=0.0, le=10.0, description="Sampling temperature of the pass.")
    prompts_per_request: int = Field(
        8, ge=1, le=4096, description="Prompts per rollout request (each asks for `samples` completions)."
    )
    concurrency: int = Field(2, ge=1, le=1024, description="Ray Data actors sending requests at once.")
    cpus_per_actor: float = Field(0.05, ge=0.0, le=64.0, description="CPUs each Ray Data actor reserves.")

    @model_validator(mode="after")
    def _band(self) -> PassRateConfig:
        if self.min_pass_rate >= self.max_pass_rate:
            raise ValueError(
                f"pass_rate.min_pass_rate {self.min_pass_rate} must be below pass_rate.max_pass_rate "
                f"{self.max_pass_rate}: no prompt could be kept"
            )
        return self
