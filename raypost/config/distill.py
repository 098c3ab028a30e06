"""Config of ``pipelines/distill.py``: a teacher, a smaller student, and a distillation mode."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from raypost.config.base import StrictModel
from raypost.config.pipelines import SFTTrainConfig
from raypost.config.sections import (
    DataConfig,
    DeepSpeedConfig,
    EvalConfig,
    ModelConfig,
    OptimConfig,
    ResourcesConfig,
    RunConfig,
    TinyModelConfig,
    check_lora_zero,
    model_path,
)
from raypost.config.serve import RolloutConfig


class TeacherConfig(StrictModel):
    """The teacher. With no path, the tiny model is built and SFT-trained first (offline default);
    with a path and ``finetune``, that model is SFT-trained on the task's demos first."""

    path: str | None = Field(
        None,
        min_length=1,
        description="HF id, local path or raypost name of a trained teacher; None: "
        "build the tiny model and SFT it here.",
    )
    finetune: bool = Field(
        False,
        description="SFT the teacher at path on the task's demos (teacher.train, "
        "teacher.optim) before distilling; the student is built from the "
        "fine-tuned teacher. Always so when path is None.",
    )
    tiny: TinyModelConfig = Field(default_factory=TinyModelConfig, description="Teacher shape when path is None.")
    train: SFTTrainConfig = Field(
        default_factory=SFTTrainConfig, description="Teacher SFT length (path=None or finetune)."
    )
    optim: OptimConfig = Field(
        default_factory=lambda: OptimConfig(lr=2e-3, micro_batch_size=4),
        description="Teacher SFT optimizer (path=None or finetune).",
    )
    data: DataConfig | None = Field(
        None,
        description="Teacher SFT data (path=None or finetune); None: the run's "
        "data. A teacher that learned from better demos than the "
        "student's (e.g. worked solutions where the student's "
        "data has guesses) is what distillation is for.",
    )

    _local_path = field_validator("path")(model_path)


class DistillAlgoConfig(StrictModel):
    """Which distillation, and its loss. Modes are looked up in raypost.phases.distill.MODES."""

    mode: Literal["offline_kd", "seq_kd", "on_policy"] = Field(
        "offline_kd",
        description="offline_kd: student fits the teacher's stored top-k log-probs (plus CE); "
        "seq_kd: student is SFT-trained on the teacher's own completions; on_policy: "
        "student samples on Serve, a teacher replica scores its tokens.",
    )
    divergence: Literal["forward_kl", "reverse_kl", "jsd"] = Field(
        "forward_kl", description="offline_kd divergence on the teacher's top-k support (raypost.algos.distill)."
    )
    beta: float = Field(0.5, gt=0.0, lt=1.0, description="jsd: teacher weight of the mixture m = beta*p + (1-beta)*q.")
    temperature: float = Field(1.0, gt=0.0, le=20.0, description="offline_kd softmax temperature (loss x tau^2).")
    kd_weight: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="offline_kd: weight of the divergence; 1 - kd_weight goes to cross-entropy on the labels.",
    )
    kd_positions: Literal["completion", "all"] = Field(
        "completion",
        description="offline_kd: the tokens the divergence fits. completion: the supervised ones; "
        "all: the prompt's too, as Minitron distills a pruned model (the teacher pass "
        "scores every position anyway; the loss is then per KD position, CE included).",
    )
    top_k: int = Field(16, ge=1, le=4096, description="offline_kd: teacher log-probs kept per token.")
    teacher_cpus: float = Field(
        2.0,
        gt=0.0,
        le=1024,
        description="offline_kd: CPUs (and torch threads) of the "
        "teacher-pass actor; it runs alone, between the learner runs.",
    )
    seq_kd_temperature: float = Field(
        0.0, ge=0.0, le=10.0, description="seq_kd: teacher sampling temperature (0 = greedy)."
    )
    seq_kd_max_prompts: int | None = Field(
        None, ge=1, le=100_000_000, description="seq_kd: train prompts the teacher answers (None: all)."
    )
    seq_kd_keep: Literal["correct", "all"] = Field(
        "correct",
        description="seq_kd: train on the teacher's answers whose final answer is right (needs gold "
        "answers; on the tiny task 'all' gave 0.295 held-out, 'correct' 0.395), or on all.",
    )
    seq_kd_epochs: int | None = Field(
        4,
        ge=1,
        le=10_000,
        description="seq_kd: epochs over the kept teacher "
        "answers (None: train.epochs). Keeping the correct half of 6,000 needs about "
        "twice the default 2 epochs: 142 steps gave 0.14 held-out, 284 gave 0.395.",
    )
    max_new_tokens: int = Field(
        96, ge=1, le=1_000_000, description="seq_kd: teacher generation budget; unfinished answers are dropped."
    )
    baseline: bool = Field(
        True, description="Also SFT the same student on the gold answers, as the baseline report.json compares against."
    )
    on_policy_loss: Literal["reverse_kl", "gkd"] = Field(
        "gkd",
        description="on_policy: gkd = distill.divergence on the teacher's top-k at every sampled position; "
        "reverse_kl = per-token reverse KL of the sampled token as a dense advantage.",
    )
    warm_start: bool = Field(
        True,
        description="on_policy: start from the baseline (the student SFT-trained on "
        "gold answers); samples of an untrained student are noise.",
    )
    on_policy_steps: int = Field(60, ge=1, le=10_000_000, description="on_policy: optimizer steps.")
    prompts_per_step: int = Field(16, ge=1, le=100_000, description="on_policy: prompts sampled per step.")
    samples_per_prompt: int = Field(2, ge=1, le=1024, description="on_policy: student samples per prompt.")
    on_policy_temperature: float = Field(1.0, gt=0.0, le=10.0, description="on_policy: student sampling temperature.")
    on_policy_optim: OptimConfig = Field(
        default_factory=lambda: OptimConfig(lr=2e-5, micro_batch_size=8, warmup_ratio=0.0, scheduler="constant"),
        description="on_policy: student optimizer; micro_batch_size counts sequences. From the warm tiny student, "
        "lr 1e-4 lowered held-out accuracy (0.435 -> 0.33 in 40 steps); 2e-5 did not (0.46 at 60).",
    )


class StudentConfig(StrictModel):
    """How the student is made from the teacher when ``model.path`` is not set. Either way it
    has the teacher's tokenizer and chat template (raypost.models.student)."""

    init: Literal["config", "prune"] = Field(
        "config",
        description="config: the teacher's architecture at model.tiny's shape (width, depth, heads, MLP), "
        "random weights; prune: the teacher keeping every keep_every-th layer (0, k, 2k...), "
        "with its own weights (a warmer start).",
    )
    keep_every: int = Field(
        2, ge=2, le=64, description="prune: keep teacher layers 0, k, 2k, ... (2 halves the depth)."
    )
    keep_layers: list[int] | None = Field(
        None,
        min_length=1,
        max_length=1024,
        description="prune: the teacher's layers to keep, ascending (overrides "
        "keep_every). On the fine-tuned SmolLM2 teacher, the first 10 and last 5 of 30 lost less than every other "
        "layer (held-out CE 7.6 vs 11.3 nats/token; benchmarks/RESULTS.md).",
    )

    @field_validator("keep_layers")
    @classmethod
    def _ascending(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (v[0] < 0 or any(b <= a for a, b in zip(v, v[1:]))):
            raise ValueError(f"student.keep_layers {v} must be distinct layer indices >= 0 in ascending order")
        return v


def _student_tiny() -> ModelConfig:
    # About a quarter of the default teacher's parameters (0.92M vs 3.4M), same tokenizer.
    return ModelConfig(
        tiny=TinyModelConfig(hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=384)
    )


class DistillConfig(StrictModel):
    """``pipelines/distill.py``: distill a teacher into a smaller student on the same data."""

    model: ModelConfig = Field(
        default_factory=_student_tiny,
        description="The student: a path, or (no path) "
        "built from the teacher as student.init "
        "says, at model.tiny's shape.",
    )
    teacher: TeacherConfig = Field(default_factory=TeacherConfig, description="The teacher.")
    student: StudentConfig = Field(
        default_factory=StudentConfig, description="How the student is built from the teacher (model.path unset)."
    )
    data: DataConfig = Field(default_factory=DataConfig, description="Training data (questions + gold answers).")
    distill: DistillAlgoConfig = Field(default_factory=DistillAlgoConfig, description="Mode and loss.")
    optim: OptimConfig = Field(
        default_factory=lambda: OptimConfig(lr=2e-3, micro_batch_size=4),
        description="Student optimizer (also the baseline's).",
    )
    train: SFTTrainConfig = Field(default_factory=SFTTrainConfig, description="Student training length.")
    deepspeed: DeepSpeedConfig = Field(default_factory=DeepSpeedConfig, description="DeepSpeed/ZeRO.")
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig, description="Learner placement.")
    rollout: RolloutConfig = Field(
        default_factory=lambda: RolloutConfig(cpus_per_replica=0.5),
        description="vLLM replicas: the teacher's (seq_kd, on_policy) and the student's (on_policy).",
    )
    run: RunConfig = Field(
        default_factory=lambda: RunConfig(name="distill"), description="Run folder, logging, checkpoints."
    )
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Held-out evaluation.")

    @model_validator(mode="after")
    def _on_policy_shape(self) -> DistillConfig:
        d = self.distill
        if d.mode != "on_policy":
            return self
        if d.warm_start and not d.baseline:
            raise ValueError(
                "distill.warm_start starts on-policy distillation from the baseline; set "
                "distill.baseline true, or distill.warm_start false"
            )
        seqs = d.prompts_per_step * d.samples_per_prompt
        per = self.resources.num_workers * d.on_policy_optim.micro_batch_size
        if seqs % per:
            raise ValueError(
                f"distill.prompts_per_step x distill.samples_per_prompt ({seqs} sequences) must be a "
                f"multiple of resources.num_workers x distill.on_policy_optim.micro_batch_size ({per})"
            )
        return self

    @model_validator(mode="after")
    def _lora_zero(self) -> DistillConfig:
        check_lora_zero(self.model, self.deepspeed)
        return self
