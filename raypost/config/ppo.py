"""Config of ``pipelines/ppo.py``: GRPO's job with a learned critic and GAE in place of the
group baseline."""

from __future__ import annotations

from pydantic import Field, model_validator

from raypost.config.base import StrictModel
from raypost.config.grpo import GRPOConfig
from raypost.config.sections import OptimConfig, ResourcesConfig, RunConfig

# Losses whose surrogate takes one advantage per token (GSPO's ratio is per sequence).
TOKEN_LOSSES = ("grpo", "dapo", "dr_grpo", "cispo")


class CriticConfig(StrictModel):
    """The value model: a second model trained beside the policy on the same Ray Train workers,
    with its own DeepSpeed engine, optimizer and checkpoint."""

    model_path: str | None = Field(
        None,
        description="Where the critic's backbone starts: None, the policy's starting weights (after "
        "the warm-up); or a folder or id, e.g. a trained reward model. Its value head starts at 0.",
    )
    optim: OptimConfig = Field(
        default_factory=lambda: OptimConfig(lr=1e-4, warmup_ratio=0.0, scheduler="constant"),
        description="The critic's optimizer (micro_batch_size: the policy's is used).",
    )
    gamma: float = Field(1.0, ge=0.0, le=1.0, description="GAE discount per token.")
    lam: float = Field(0.95, ge=0.0, le=1.0, description="GAE lambda: 1 is the Monte-Carlo return less V.")
    value_clip: float = Field(
        0.2, gt=0.0, le=1e6, description="PPO2 value clipping around the values before this batch's updates."
    )
    epochs: int = Field(
        1, ge=1, le=32, description="Critic optimizer steps per batch (the clipping binds from the second)."
    )
    warmup_steps: int = Field(
        0, ge=0, le=100_000, description="Steps that train only the critic (verl's critic_warmup); the policy waits."
    )
    whiten_advantages: bool = Field(True, description="Advantages to mean 0, std 1 over the global batch.")


class PPOConfig(GRPOConfig):
    """PPO with a learned critic: the GRPO job's rollouts, rewards, async mode and staleness bound,
    with per-token GAE advantages from a value model instead of the group's baseline
    (``algo.advantage`` is not used; ``algo.group_size`` is only how many samples a prompt gets)."""

    critic: CriticConfig = Field(default_factory=CriticConfig, description="The value model and GAE.")
    resources: ResourcesConfig = Field(
        default_factory=lambda: ResourcesConfig(jemalloc_decay_ms=5000),
        description="Learner placement. Freed pages go back to the OS after 5 s (jemalloc_decay_ms): a "
        "SmolLM2 PPO learner holds two models, and keeping every freed page grew it 1 GB a step into an OOM.",
    )
    run: RunConfig = Field(
        default_factory=lambda: RunConfig(name="ppo", checkpoint_every=10, log_every=1),
        description="Run folder, logging, checkpoints.",
    )

    @model_validator(mode="after")
    def _token_loss(self) -> PPOConfig:
        if self.algo.loss not in TOKEN_LOSSES:
            raise ValueError(
                f"algo.loss {self.algo.loss!r} takes one advantage per sequence; PPO's GAE gives one "
                f"per token: use one of {', '.join(TOKEN_LOSSES)} (dapo: the token mean, as PPO)"
            )
        return self

    @model_validator(mode="after")
    def _warmup_inside_run(self) -> PPOConfig:
        if self.critic.warmup_steps >= self.algo.steps:
            raise ValueError(
                f"critic.warmup_steps {self.critic.warmup_steps} leaves none of algo.steps "
                f"{self.algo.steps} to the policy; lower the first or raise the second"
            )
        return self
