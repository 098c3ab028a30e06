"""Config sections shared by every pipeline. Every field has a description and bounds."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from raypost.config.base import StrictModel, refuse_credentials


def absolute_if_local(value: str | None) -> str | None:
    """An existing local path made absolute (Ray workers do not share the driver's cwd); an HF
    id or a missing path is kept as given."""
    return str(Path(value).resolve()) if value is not None and Path(value).exists() else value


def model_path(value: str | None) -> str | None:
    """A model: a raypost name (``smollm2-135m-instruct``, whose package must be installed), an
    HF id, or a local path (made absolute)."""
    from raypost.models import named

    if named.is_named(value):
        named.check_installed(value)  # ValueError: pydantic names the field
        return value
    return absolute_if_local(value)


BUILTIN_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")


def check_ray_resources(value: dict[str, float]) -> dict[str, float]:
    """Ray custom resources ({name: amount}) a learner worker or a replica requests, to pin it to
    the node group that advertises them (``ray start --resources '{"learner": 4}'``)."""
    for key, amount in value.items():
        if key in BUILTIN_RESOURCES or not key:
            raise ValueError(
                f"{key!r} is not a custom resource: CPUs and GPUs have their own fields (cpus_per_*, "
                "gpus_per_*); ray_resources names custom resources, e.g. {learner_node: 1}"
            )
        if not 0 < amount <= 1e6:
            raise ValueError(f"ray_resources.{key} = {amount}: amounts must be in (0, 1e6]")
    return value


class TinyModelConfig(StrictModel):
    """The offline model built from config: Qwen2 architecture, tokenizer trained locally."""

    hidden_size: int = Field(256, ge=16, le=8192, description="Width of the residual stream.")
    num_layers: int = Field(4, ge=1, le=128, description="Number of decoder layers.")
    num_heads: int = Field(4, ge=1, le=128, description="Attention heads.")
    num_kv_heads: int = Field(2, ge=1, le=128, description="Key/value heads (GQA); must divide num_heads.")
    intermediate_size: int = Field(768, ge=16, le=65536, description="MLP width.")
    vocab_size: int = Field(1024, ge=128, le=262144, description="Target vocabulary size of the trained BPE.")
    max_position_embeddings: int = Field(512, ge=32, le=131072, description="Longest sequence the model supports.")
    seed: int = Field(0, ge=0, description="Seed for the initial weights.")

    @model_validator(mode="after")
    def _heads_divide(self) -> TinyModelConfig:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be a multiple of num_heads ({self.num_heads})")
        return self


class LoraConfig(StrictModel):
    """LoRA adapters through peft; the base weights stay frozen."""

    enabled: bool = Field(False, description="Train LoRA adapters instead of all weights.")
    r: int = Field(8, ge=1, le=1024, description="Adapter rank.")
    alpha: int = Field(16, ge=1, le=4096, description="LoRA scaling numerator.")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the adapter input.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        min_length=1,
        description="Module names that get adapters.",
    )


class ModelConfig(StrictModel):
    """Which model to train. ``path`` empty means: build the offline tiny model."""

    path: str | None = Field(
        None,
        min_length=1,
        description="HF id, local path or a raypost name (smollm2-135m-instruct); None builds the tiny model.",
    )
    tiny: TinyModelConfig = Field(default_factory=TinyModelConfig, description="Tiny-model shape (path=None).")
    gradient_checkpointing: bool = Field(False, description="Recompute activations in backward to save memory.")
    lora: LoraConfig = Field(default_factory=LoraConfig, description="Optional LoRA adapters.")

    _local_path = field_validator("path")(model_path)


class SyntheticTaskConfig(StrictModel):
    """The embedded arithmetic task (integer answers): GSM8K-style word problems, or chains."""

    task: Literal["word_problems", "chains"] = Field(
        "word_problems",
        description="word_problems (one or two steps) or chains: 'What is 347 * 29 - 812 + 56?', 3-5 operands "
        "from 10..max_operand (the calculator agent's task; max_operand 999 gives 2-3 digits).",
    )

    num_train: int = Field(6000, ge=1, le=10_000_000, description="Training problems generated.")
    num_eval: int = Field(200, ge=1, le=1_000_000, description="Held-out problems generated (disjoint seed).")
    max_operand: int = Field(10, ge=2, le=10_000, description="Operands are drawn from 1..max_operand.")
    two_step_fraction: float = Field(0.3, ge=0.0, le=1.0, description="Share of problems with two operations.")
    guess_fraction: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="Share of training problems whose SFT demo is a "
        "weak teacher's wrong guess ('#### <first number>'); gold answers are unchanged.",
    )
    tool_demos: bool = Field(
        False,
        description="chains: the training rows' SFT demos are the calculator agent's turns, in Hermes format: "
        "the call on the row's expression, or (tool_answer_share of rows) the answer after that call's result.",
    )
    tool_answer_share: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="With tool_demos: the share of demos that answer after the call's result; the rest are calls. "
        "0: the warm-up teaches only the call, and when to stop and answer is left to the reward.",
    )
    seed: int = Field(1234, ge=0, description="Generator seed; eval uses seed+1.")

    @model_validator(mode="after")
    def _tool_demos_need_chains(self) -> SyntheticTaskConfig:
        if self.tool_demos and self.task != "chains":
            raise ValueError("tool_demos needs task: chains (a calculator call on the row's expression)")
        return self


class DataConfig(StrictModel):
    """Where prompts come from and how they become token ids."""

    source: Literal["synthetic", "jsonl", "parquet", "hf"] = Field(
        "synthetic", description="synthetic (offline default), jsonl, parquet or hf (datasets name or path)."
    )
    path: str | None = Field(None, min_length=1, description="File, folder or HF dataset id (not for synthetic).")
    eval_path: str | None = Field(
        None, min_length=1, description="Held-out file/split path; default: split off eval_fraction."
    )
    hf_split: str = Field("train", min_length=1, description="Split of an HF dataset to read.")
    hf_config: str | None = Field(None, description="HF dataset config name (GSM8K: 'main').")
    prompt_field: str = Field("question", min_length=1, description="Row field holding the question.")
    answer_field: str = Field(
        "answer", min_length=1, description="Row field holding the answer (GSM8K '#### n' parsed)."
    )
    eval_fraction: float = Field(0.05, gt=0.0, lt=1.0, description="Held-out share when no eval_path is given.")
    max_eval_samples: int = Field(200, ge=1, le=100_000, description="Cap on held-out problems used for accuracy.")
    system_prompt: str | None = Field(
        None,
        description="Optional system message put before every question (None: "
        "the chat template's default, if it has one).",
    )
    prompt_template: str = Field(
        "{question}",
        min_length=10,
        description="The user turn, with {question} replaced by "
        "the row's question: tell a pretrained model the answer format here, e.g. "
        "\"{question}\\nEnd with a line '#### <number>'.\"",
    )
    max_seq_len: int = Field(
        256, ge=16, le=131072, description="Rows longer than this (prompt+answer tokens) are rejected."
    )
    max_row_bytes: int = Field(
        1 << 20, ge=1024, le=1 << 30, description="A JSONL line longer than this is rejected unparsed."
    )
    pack: bool = Field(
        True, description="SFT: pack several examples into one max_seq_len row (attention kept per example)."
    )
    synthetic: SyntheticTaskConfig = Field(default_factory=SyntheticTaskConfig, description="Synthetic task settings.")

    _local_paths = field_validator("path", "eval_path")(absolute_if_local)

    @field_validator("path", "eval_path")
    @classmethod
    def _no_credentials(cls, value: str | None, info: Any) -> str | None:
        return value if value is None else refuse_credentials(value, f"data.{info.field_name}")

    @field_validator("prompt_template")
    @classmethod
    def _has_question(cls, value: str) -> str:
        if "{question}" not in value:
            raise ValueError(
                f"prompt_template {value!r} has no {{question}}: put {{question}} where the row's question goes"
            )
        return value

    @model_validator(mode="before")
    @classmethod
    def _infer_source(cls, data: Any) -> Any:
        """``--dataset x.jsonl`` alone is enough: the source follows from the path."""
        if isinstance(data, dict) and data.get("path") and "source" not in data:
            path = str(data["path"])
            data = {
                **data,
                "source": "jsonl"
                if path.endswith((".jsonl", ".json"))
                else "parquet"
                if path.endswith(".parquet")
                else "hf",
            }
        return data

    @model_validator(mode="after")
    def _path_needed(self) -> DataConfig:
        if self.source != "synthetic" and self.path is None:
            raise ValueError(f"data.path is required when data.source is '{self.source}'")
        return self


def check_lora_zero(model: ModelConfig, deepspeed: DeepSpeedConfig) -> None:
    """LoRA adapters are not supported under ZeRO-3 (parameters are partitioned)."""
    if model.lora.enabled and deepspeed.zero_stage == 3:
        raise ValueError("model.lora.enabled with deepspeed.zero_stage 3 is not supported; use zero_stage <= 2")


class OptimConfig(StrictModel):
    """Optimizer, schedule and batch shape of a learner."""

    lr: float = Field(1e-3, gt=0.0, le=1.0, description="Peak learning rate (AdamW).")
    weight_decay: float = Field(0.0, ge=0.0, le=1.0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.95), description="AdamW betas.")
    warmup_ratio: float = Field(0.05, ge=0.0, le=0.5, description="Share of steps with linear warm-up.")
    scheduler: Literal["cosine", "linear", "constant"] = Field("cosine", description="LR schedule after warm-up.")
    grad_clip: float = Field(1.0, gt=0.0, le=1e6, description="Max global grad norm.")
    micro_batch_size: int = Field(16, ge=1, le=65536, description="Rows per worker per forward pass.")
    grad_accum: int = Field(1, ge=1, le=4096, description="Micro-batches accumulated per optimizer step.")

    @model_validator(mode="after")
    def _betas_in_range(self) -> OptimConfig:
        if not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"betas must lie in [0, 1), got {self.betas}")
        return self


class DeepSpeedConfig(StrictModel):
    """How the learner is wrapped by DeepSpeed."""

    zero_stage: int = Field(2, ge=0, le=3, description="ZeRO stage 0-3.")
    precision: Literal["fp32", "bf16"] = Field(
        "fp32", description="fp32 (fastest on CPUs without AVX512-BF16) or bf16."
    )
    offload_optimizer: bool = Field(False, description="ZeRO-Offload of optimizer state to CPU memory.")


class ResourcesConfig(StrictModel):
    """Placement of the learner. Checked against the cluster before anything starts."""

    num_workers: int = Field(2, ge=1, le=4096, description="Ray Train workers (data-parallel ranks).")
    cpus_per_worker: float = Field(0.5, gt=0.0, le=1024, description="Logical CPUs reserved per worker.")
    gpus_per_worker: float = Field(0.0, ge=0.0, le=16, description="GPUs per worker; >0 uses NCCL instead of gloo.")
    torch_threads: int | None = Field(
        None, ge=1, le=1024, description="torch intra-op threads per worker (default: cores/workers)."
    )
    jemalloc: bool = Field(
        True,
        description="Preload the jemalloc that ships with Ray into the learner workers, keeping "
        "freed pages for reuse: with glibc's malloc every step faults its large "
        "tensors (logits, activations) in again (a third of a SmolLM2 step on CPU).",
    )
    jemalloc_decay_ms: int = Field(
        -1,
        ge=-1,
        le=3_600_000,
        description="With jemalloc: freed pages go back to the OS after this many ms; -1 never (fastest, and "
        "flat when every step has the same shapes). Multi-turn episodes vary in length and the kept "
        "pages grew a SmolLM2 learner 1 GB a step: 5000 kept it flat, its learner ~1.2x slower.",
    )
    ray_resources: dict[str, float] = Field(
        default_factory=dict,
        description="Ray custom resources each worker requests, to pin the learner to the nodes "
        "that advertise them, e.g. {learner_node: 1}.",
    )

    _ray_resources = field_validator("ray_resources")(check_ray_resources)


URI_SCHEMES = {"s3", "gs", "gcs", "hdfs", "viewfs", "abfs", "abfss", "file"}  # pyarrow's FileSystem.from_uri


class RunConfig(StrictModel):
    """Where the run lives and how it reports."""

    name: str = Field(
        "raypost-run", min_length=1, pattern=r"^[A-Za-z0-9_.\-]+$", description="Run name (folder and resume key)."
    )
    storage_path: str = Field(
        "runs",
        min_length=1,
        description=(
            "Root of runs: a folder, or a URI of a pyarrow filesystem (s3://bucket/runs, gs://..., "
            "hdfs://...; query options such as ?endpoint_override=host:port&scheme=http for S3-compatible "
            "stores). A URI run works in a local copy and mirrors it there (raypost.utils.storage). "
            "The same name + storage resumes."
        ),
    )
    seed: int = Field(0, ge=0, description="Global seed (data order, sampling, init of new heads).")
    log_every: int = Field(10, ge=1, le=100_000, description="Steps between progress lines.")
    checkpoint_every: int = Field(50, ge=1, le=1_000_000, description="Steps between checkpoints.")
    keep_checkpoints: int = Field(2, ge=1, le=1000, description="Checkpoints kept on storage.")
    max_failures: int = Field(
        3,
        ge=-1,
        le=1000,
        description="Worker-group restarts allowed (-1: unlimited): a learner worker that dies (its node lost, "
        "killed for memory) restarts the group from the last checkpoint. 0: the first death ends the run.",
    )
    wandb_mode: Literal["offline", "online", "disabled"] = Field(
        "offline", description="wandb mode; offline by default."
    )
    ray_address: str | None = Field(
        None, description="Ray address; None joins the job's cluster or starts a local one."
    )
    lock_wait_s: float = Field(
        120.0,
        ge=0.0,
        le=86_400.0,
        description="How long a driver waits for another driver of the same run folder to end (a driver "
        "orphaned by a head failure exits within about a minute) before it is refused.",
    )

    @field_validator("storage_path")
    @classmethod
    def _known_scheme(cls, v: str) -> str:
        scheme = v.split("://", 1)[0] if "://" in v else None
        if scheme is not None and scheme not in URI_SCHEMES:
            raise ValueError(
                f"run.storage_path: unknown scheme {scheme!r}; use a folder or one of "
                f"{', '.join(sorted(URI_SCHEMES))}://"
            )
        return refuse_credentials(v, "run.storage_path")


class EvalConfig(StrictModel):
    """Held-out greedy exact-match evaluation."""

    max_new_tokens: int = Field(48, ge=1, le=32768, description="Generation budget per held-out question.")
    batch_size: int = Field(64, ge=1, le=4096, description="Questions generated per batch.")
    extract: Literal["strict", "flexible"] = Field(
        "strict",
        description="How a completion's final answer is read: 'strict' only a '#### n' line; 'flexible' "
        "also \\boxed{}, 'the answer is n' and the last number (pretrained models' habits).",
    )
    engine: Literal["transformers", "vllm"] = Field(
        "transformers",
        description="SFT and distillation: greedy decoding with transformers generate in a Ray task, "
        "or on a vLLM replica deployed for the evaluation (rollout settings; much faster "
        "for real models). GRPO always evaluates on its rollout replicas.",
    )
