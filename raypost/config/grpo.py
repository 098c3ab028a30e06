"""Config of ``pipelines/grpo.py``: SFT warm-up, then GRPO with Serve rollouts and rewards."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from raypost.config.agent import AgentConfig
from raypost.config.base import StrictModel
from raypost.config.filtering import PassRateConfig
from raypost.config.pipelines import SFTTrainConfig
from raypost.config.sections import (
    DataConfig,
    DeepSpeedConfig,
    EvalConfig,
    ModelConfig,
    OptimConfig,
    ResourcesConfig,
    RunConfig,
    SyntheticTaskConfig,
    check_lora_zero,
)
from raypost.config.serve import RewardServiceConfig, RewardSpec, RolloutConfig


class WarmupConfig(StrictModel):
    """The SFT warm-up before GRPO (the SFT learner itself)."""

    enabled: bool = Field(True, description="Run SFT before GRPO (skip for an already instruction-tuned model).")
    train: SFTTrainConfig = Field(
        default_factory=lambda: SFTTrainConfig(epochs=1),
        description="Length of the warm-up: one epoch of the embedded task's 6000 demos (126 steps), "
        "its lr decayed to 0 by the end (held-out accuracy on the tiny model only rises once it has).",
    )
    optim: OptimConfig = Field(
        default_factory=lambda: OptimConfig(lr=2e-3, micro_batch_size=4), description="Warm-up optimizer."
    )


class AlgoConfig(StrictModel):
    """GRPO and its variants. Names are looked up in raypost.algos registries."""

    advantage: Literal["grpo", "rloo", "reinforce_pp"] = Field("grpo", description="Advantage estimator.")
    std_normalize: bool = Field(True, description="Divide advantages by the std (False = Dr.GRPO).")
    loss: Literal["grpo", "dapo", "dr_grpo", "gspo", "cispo"] = Field(
        "grpo",
        description="Policy loss: grpo, dapo, dr_grpo (token clipping, three aggregations), gspo (sequence-level "
        "ratio and clip; the paper's eps is ~3e-4/4e-4) or cispo (clipped stop-gradient IS weight on every token; "
        "eps_low 1.0 for no lower bound).",
    )
    group_size: int = Field(8, ge=2, le=1024, description="G: completions sampled per prompt.")
    prompts_per_step: int = Field(8, ge=1, le=100_000, description="Prompts (groups) trained per step.")
    eps_low: float = Field(0.2, ge=0.0, le=1.0, description="Lower clip range of the ratio.")
    eps_high: float = Field(0.2, ge=0.0, le=10.0, description="Upper clip range (DAPO clip-higher: > eps_low).")
    beta: float = Field(0.0, ge=0.0, le=10.0, description="KL-to-reference weight; 0 skips the reference model.")
    kl_estimator: Literal["k1", "k2", "k3"] = Field("k3", description="Per-token KL estimator.")
    dynamic_sampling: bool = Field(False, description="DAPO: drop groups whose rewards are all equal and refill.")
    max_refill_rounds: int = Field(
        3,
        ge=0,
        le=100,
        description="Dynamic sampling: at most this many x prompts_per_step "
        "all-equal groups are dropped (and replaced) per trained batch.",
    )
    max_failed_groups: int = Field(
        16,
        ge=0,
        le=1_000_000,
        description="Groups whose generation or scoring still fails after the clients' retries "
        "are dropped and replaced, up to this many among any algo.failure_window admitted groups (reported "
        "as groups_failed); one more ends the run.",
    )
    failure_window: int = Field(
        1000,
        ge=1,
        le=100_000_000,
        description="The window of algo.max_failed_groups, in admitted groups: scattered transient failures "
        "over a multi-day run leave it and refill the budget; a persistent fault still spends it.",
    )
    overlong: Literal["none", "filter", "penalty"] = Field(
        "none", description="DAPO: truncated samples are masked out (filter) or penalized (penalty)."
    )
    overlong_penalty: float = Field(1.0, ge=0.0, le=100.0, description="Penalty for a truncated sample.")
    temperature: float = Field(1.0, gt=0.0, le=10.0, description="Rollout sampling temperature.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Rollout nucleus sampling.")
    max_new_tokens: int = Field(48, ge=1, le=1_000_000, description="Rollout generation budget.")
    steps: int = Field(60, ge=1, le=10_000_000, description="GRPO optimizer steps.")
    skip_zero_terms: bool = Field(
        True,
        description="The learner runs no forward or backward on a sequence whose loss term is zero: advantage "
        "0 (its group's rewards all equal) with no KL term (beta 0), or no token in the loss. The gradient "
        "is the same; the step is cheaper. The loss metrics (entropy, clip_frac) are then over the sequences "
        "trained, and skipped_frac reports the share left out.",
    )

    @model_validator(mode="after")
    def _clip_order(self) -> AlgoConfig:
        if self.eps_high < self.eps_low and self.loss == "dapo":
            raise ValueError(f"DAPO clip-higher needs eps_high >= eps_low, got {self.eps_high} < {self.eps_low}")
        return self


class AsyncConfig(StrictModel):
    """Async GRPO (AReaL-style): a rollout producer keeps the replicas busy while the learner
    trains; admission control keeps every trained sample at most ``eta`` weight versions old."""

    eta: int = Field(
        0,
        ge=0,
        le=64,
        description="Max staleness in weight versions. 0 is the synchronous loop "
        "(generate with version k, train, push k+1); 1-2 overlap "
        "generation of the next batches with training.",
    )
    correction: Literal["none", "tis", "decoupled"] = Field(
        "tis",
        description="Off-policy correction (raypost.algos.offpolicy): truncated importance sampling, "
        "AReaL's decoupled objective, or none (ratio to the behaviour policy).",
    )
    is_cap: float = Field(
        2.0, gt=1.0, le=1e4, description="Importance-weight cap: tis truncates at it, decoupled drops tokens above it."
    )


class GRPOConfig(StrictModel):
    """``pipelines/grpo.py``: the main job."""

    model: ModelConfig = Field(default_factory=ModelConfig, description="Policy model (tiny model if no path).")
    data: DataConfig = Field(
        default_factory=lambda: DataConfig(
            synthetic=SyntheticTaskConfig(num_train=6000, max_operand=5, guess_fraction=0.5)
        ),
        description="Prompts and answers. The embedded task's SFT demos are noisy: half are a weak teacher's wrong "
        "guess, so the warm-up learns both worked solutions and guessing, and GRPO's reward has a "
        "behaviour to select; operands 1..5, so one warm-up epoch learns the worked solutions "
        "(docs/guide.md: 'The embedded default').",
    )
    warmup: WarmupConfig = Field(default_factory=WarmupConfig, description="SFT warm-up.")
    algo: AlgoConfig = Field(
        default_factory=lambda: AlgoConfig(prompts_per_step=16, steps=40), description="GRPO algorithm."
    )
    optim: OptimConfig = Field(
        default_factory=lambda: OptimConfig(lr=1e-4, micro_batch_size=16, warmup_ratio=0.0, scheduler="constant"),
        description="GRPO optimizer; micro_batch_size counts sequences. On the embedded default, lr 5e-5 "
        "is too slow for 40 steps; on a pretrained model use far less (examples/grpo_smollm2.yaml).",
    )
    deepspeed: DeepSpeedConfig = Field(default_factory=DeepSpeedConfig, description="DeepSpeed/ZeRO.")
    resources: ResourcesConfig = Field(
        default_factory=lambda: ResourcesConfig(jemalloc_decay_ms=60_000),
        description="Learner placement. Freed pages go back to the OS after 60 s (jemalloc_decay_ms): batch "
        "shapes vary (skipped rows, response lengths), and keeping every freed page grew a SmolLM2 learner "
        "0.05-0.17 GB a step into an OOM kill at step 81; 60 s held it at 3.9-4.1 GB, steps 1.2x longer.",
    )
    placement: Literal["disaggregated", "colocated"] = Field(
        "disaggregated",
        description="disaggregated: rollout and learner reserve separate CPUs/GPUs; colocated: "
        "they share them and take turns.",
    )
    rollout: RolloutConfig = Field(
        default_factory=lambda: RolloutConfig(cpus_per_replica=0.5), description="vLLM rollout replicas."
    )
    async_rl: AsyncConfig = Field(default_factory=AsyncConfig, description="Async mode: bounded staleness.")
    reward: RewardServiceConfig = Field(
        default_factory=lambda: RewardServiceConfig(
            cpus_per_replica=0.25, rewards=[RewardSpec(name="accuracy", fn="accuracy", weight=1.0, needs_labels=True)]
        ),
        description="Reward service. Accuracy only by default: with std-normalized advantages, a group whose "
        "only difference is a small format bonus gets full-size advantages that reinforce its "
        "wrong answers.",
    )
    run: RunConfig = Field(
        default_factory=lambda: RunConfig(name="grpo", checkpoint_every=10, log_every=1),
        description="Run folder, logging, checkpoints.",
    )
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Held-out evaluation.")
    agent: AgentConfig = Field(
        default_factory=AgentConfig, description="Multi-turn episodes with an environment and tools (env set)."
    )
    pass_rate: PassRateConfig = Field(
        default_factory=PassRateConfig,
        description="Before RL: sample each training prompt k times, keep those inside a pass-rate band, "
        "optionally easy first (sparse rewards: docs/guide.md).",
    )

    @model_validator(mode="after")
    def _batch_divides(self) -> GRPOConfig:
        seqs = self.algo.prompts_per_step * self.algo.group_size
        per_step = self.resources.num_workers * self.optim.micro_batch_size
        if seqs % per_step:
            raise ValueError(
                f"algo.prompts_per_step x algo.group_size ({seqs} sequences) must be a multiple of "
                f"resources.num_workers x optim.micro_batch_size ({per_step})"
            )
        return self

    @model_validator(mode="after")
    def _lora_zero(self) -> GRPOConfig:
        check_lora_zero(self.model, self.deepspeed)
        return self

    @model_validator(mode="after")
    def _fits_tiny_model(self) -> GRPOConfig:
        limit = self.model.tiny.max_position_embeddings
        if self.model.path is None and self.rollout.max_model_len > limit:
            raise ValueError(
                f"rollout.max_model_len {self.rollout.max_model_len} exceeds the tiny model's "
                f"model.tiny.max_position_embeddings {limit}; lower the first or raise the second"
            )
        return self

    @model_validator(mode="after")
    def _prompts_fit_the_engine(self) -> GRPOConfig:
        if self.data.max_seq_len > self.rollout.max_model_len:
            raise ValueError(
                f"data.max_seq_len {self.data.max_seq_len} exceeds rollout.max_model_len "
                f"{self.rollout.max_model_len}: prompts that long would fail at the rollout replicas; "
                "lower data.max_seq_len or raise rollout.max_model_len"
            )
        return self

    @model_validator(mode="after")
    def _no_grad_accum(self) -> GRPOConfig:
        if self.optim.grad_accum != 1:
            raise ValueError(
                f"optim.grad_accum {self.optim.grad_accum} is not used by GRPO: a step trains "
                "algo.prompts_per_step x algo.group_size sequences, in micro-batches of "
                "optim.micro_batch_size per worker; remove optim.grad_accum and set those instead"
            )
        return self

    @property
    def grad_accum(self) -> int:
        """Micro-batches per rank per step (DeepSpeed's gradient_accumulation_steps)."""
        seqs = self.algo.prompts_per_step * self.algo.group_size
        return seqs // (self.resources.num_workers * self.optim.micro_batch_size)
