"""Config of the ``dpo`` pipeline: offline preference optimization (DPO, IPO, SimPO) of a causal LM."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from raypost.config.base import StrictModel
from raypost.config.reward_model import PairsConfig
from raypost.config.sections import (
    DataConfig,
    DeepSpeedConfig,
    EvalConfig,
    ModelConfig,
    OptimConfig,
    ResourcesConfig,
    RunConfig,
    SyntheticTaskConfig,
)
from raypost.config.serve import RewardServiceConfig, RewardSpec, RolloutConfig


class PreferenceLossConfig(StrictModel):
    """The preference loss (``raypost.algos.preference``) and its length."""

    loss: Literal["sigmoid", "ipo", "simpo"] = Field(
        "sigmoid", description="sigmoid: DPO; ipo: IPO on per-token log-ratios; simpo: SimPO (no reference model)."
    )
    beta: float = Field(0.1, gt=0.0, le=100.0, description="DPO/IPO: KL-penalty strength; SimPO: reward scale.")
    label_smoothing: float = Field(
        0.0, ge=0.0, lt=0.5, description="sigmoid: share of labels taken as flipped (conservative DPO)."
    )
    simpo_gamma: float = Field(0.5, ge=0.0, le=100.0, description="SimPO: target reward margin.")
    nll_weight: float = Field(
        0.0,
        ge=0.0,
        le=100.0,
        description="RPO (Pang et al. 2024): add this times the chosen response's per-token NLL to each pair's "
        "loss (TRL: loss_type [sigmoid, sft]; the paper uses 1.0): the chosen responses stay likely, not only "
        "preferred.",
    )
    reference: Literal["model", "precomputed"] = Field(
        "model",
        description="model: the frozen starting policy on every learner worker, run each step; precomputed: its "
        "log-probs computed once by a Ray Data pass before training, so the learner holds no reference model.",
    )
    epochs: int = Field(1, ge=1, le=1000, description="Passes over the training pairs.")
    max_steps: int | None = Field(None, ge=1, le=10_000_000, description="Stop after this many optimizer steps.")
    eval_every: int | None = Field(
        None, ge=1, description="Steps between held-out passes (implicit-reward accuracy; None: end only)."
    )
    max_eval_pairs: int = Field(256, ge=1, le=1_000_000, description="Cap on held-out pairs scored.")

    @model_validator(mode="after")
    def _smoothing_is_sigmoid_only(self) -> PreferenceLossConfig:
        if self.label_smoothing and self.loss != "sigmoid":
            raise ValueError(
                f"dpo.label_smoothing applies to dpo.loss=sigmoid only (got dpo.loss={self.loss}); set it to 0"
            )
        return self


class PolicyPairsConfig(StrictModel):
    """On-policy pairs (RAFT / online-DPO style): before training, a Ray Data pass samples
    ``samples`` completions of each question on a vLLM replica serving the starting policy,
    scores them on the reward app, and keeps per question the highest-reward sample as chosen
    and the lowest as rejected, as sampled (token ids, not re-tokenized), when their rewards
    differ by more than ``min_margin`` (``pairs_per_question`` > 1: also the next distinct
    low-reward samples, each against a best one). Held-out questions give the held-out pairs the same way,
    and their greedy accuracy before and after training is the run's headline figure."""

    enabled: bool = Field(False, description="Sample the pairs from the policy (off: pairs.build or given pairs).")
    samples: int = Field(8, ge=2, le=64, description="k: completions sampled per question.")
    temperature: float = Field(1.0, gt=0.0, le=10.0, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling.")
    max_new_tokens: int = Field(128, ge=1, le=32768, description="Tokens per sampled completion.")
    min_margin: float = Field(
        0.0, ge=0.0, le=1e6, description="Keep a question's pair when best reward - worst reward exceeds this."
    )
    max_prompts: int | None = Field(
        None, ge=1, le=100_000_000, description="Sample at most this many training questions (seeded pick)."
    )
    pairs_per_question: int = Field(
        1,
        ge=1,
        le=64,
        description="Pairs kept per question: its distinct low-reward samples, worst first, each against a "
        "best one (1: best against worst). More pairs from the same samples where few questions give one.",
    )
    prompts_per_request: int = Field(8, ge=1, le=4096, description="Questions per rollout request.")
    concurrency: int = Field(2, ge=1, le=1024, description="Ray Data actors sending requests at once.")
    cpus_per_actor: float = Field(0.05, ge=0.0, le=64.0, description="CPUs each Ray Data actor reserves.")


class DPOConfig(StrictModel):
    """``raypost dpo``: preference pairs with Ray Data, DPO on Ray Train + DeepSpeed."""

    model: ModelConfig = Field(default_factory=ModelConfig, description="Policy (tiny model if no path).")
    data: DataConfig = Field(
        default_factory=lambda: DataConfig(max_seq_len=256, synthetic=SyntheticTaskConfig(num_train=4000)),
        description="Source rows: pairs built from question/answer rows, or given pairs (pairs.build false).",
    )
    pairs: PairsConfig = Field(default_factory=PairsConfig, description="Preference pairs.")
    dpo: PreferenceLossConfig = Field(default_factory=PreferenceLossConfig, description="Loss and length.")
    optim: OptimConfig = Field(
        default_factory=lambda: OptimConfig(lr=5e-4, micro_batch_size=8, warmup_ratio=0.05),
        description="Optimizer; micro_batch_size counts pairs. The tiny model learns at 5e-4; real models "
        "use about 5e-7 to 5e-6.",
    )
    deepspeed: DeepSpeedConfig = Field(default_factory=DeepSpeedConfig, description="DeepSpeed/ZeRO.")
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig, description="Learner placement.")
    run: RunConfig = Field(
        default_factory=lambda: RunConfig(name="dpo", checkpoint_every=100), description="Run folder, checkpoints."
    )
    policy_pairs: PolicyPairsConfig = Field(
        default_factory=PolicyPairsConfig, description="Pairs sampled from the policy and scored (enabled)."
    )
    rollout: RolloutConfig = Field(
        default_factory=RolloutConfig, description="policy_pairs: the vLLM replicas sampling the policy."
    )
    reward: RewardServiceConfig = Field(
        default_factory=lambda: RewardServiceConfig(
            cpus_per_replica=0.25, rewards=[RewardSpec(name="accuracy", fn="accuracy", weight=1.0, needs_labels=True)]
        ),
        description="policy_pairs: the reward app scoring the samples.",
    )
    eval: EvalConfig = Field(
        default_factory=lambda: EvalConfig(engine="vllm"),
        description="policy_pairs: held-out greedy accuracy before and after (data.max_eval_samples questions).",
    )

    @model_validator(mode="after")
    def _policy_pairs_need_questions(self) -> DPOConfig:
        if self.policy_pairs.enabled and not self.pairs.build:
            raise ValueError(
                "policy_pairs.enabled samples the policy on question/answer rows; pairs.build=false says the rows "
                "are given pairs. Set pairs.build true (its default) or policy_pairs.enabled false"
            )
        return self
