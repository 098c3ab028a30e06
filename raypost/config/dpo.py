"""Config of the ``dpo`` pipeline: offline preference optimization (DPO, IPO, SimPO) of a causal LM."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from raypost.config.base import StrictModel
from raypost.config.reward_model import PairsConfig
from raypost.config.sections import (
    DataConfig,
    DeepSpeedConfig,
    ModelConfig,
    OptimConfig,
    ResourcesConfig,
    RunConfig,
    SyntheticTaskConfig,
)


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
