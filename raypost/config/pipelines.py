"""Top-level config of each pipeline: the sections it is made of, plus its own."""

from __future__ import annotations

from pydantic import Field, model_validator

from raypost.config.base import StrictModel
from raypost.config.sections import (
    DataConfig,
    DeepSpeedConfig,
    EvalConfig,
    ModelConfig,
    OptimConfig,
    ResourcesConfig,
    RunConfig,
    check_lora_zero,
)


class SFTTrainConfig(StrictModel):
    """How long SFT trains."""

    epochs: int = Field(2, ge=1, le=10_000, description="Passes over the training data.")
    max_steps: int | None = Field(None, ge=1, le=10_000_000, description="Stop after this many optimizer steps.")
    eval_every: int | None = Field(None, ge=1, description="Steps between eval-loss passes (None: end only).")
    eval_loss: bool = Field(
        True,
        description="Held-out loss passes (every eval_every steps, and at the end). Off when "
        "held-out accuracy is the measure: a pass is a forward over the eval split.",
    )


class SFTConfig(StrictModel):
    """``pipelines/sft.py``: supervised fine-tuning on question -> worked answer."""

    model: ModelConfig = Field(default_factory=ModelConfig, description="Model to train.")
    data: DataConfig = Field(default_factory=DataConfig, description="Training data.")
    optim: OptimConfig = Field(
        default_factory=lambda: OptimConfig(lr=2e-3, micro_batch_size=4),
        description="Optimizer and batch (defaults tuned on the tiny model: small batches, many updates).",
    )
    deepspeed: DeepSpeedConfig = Field(default_factory=DeepSpeedConfig, description="DeepSpeed/ZeRO.")
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig, description="Learner placement.")
    run: RunConfig = Field(
        default_factory=lambda: RunConfig(name="sft"), description="Run folder, logging, checkpoints."
    )
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Held-out evaluation.")
    train: SFTTrainConfig = Field(default_factory=SFTTrainConfig, description="Length of training.")

    @model_validator(mode="after")
    def _lora_zero(self) -> SFTConfig:
        check_lora_zero(self.model, self.deepspeed)
        return self
