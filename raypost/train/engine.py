"""Model + DeepSpeed engine setup shared by every learner (SFT, GRPO, distillation, RM)."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from raypost.config import DeepSpeedConfig, ModelConfig, OptimConfig, ResourcesConfig

log = logging.getLogger("raypost.learner")


def deepspeed_config(ds: DeepSpeedConfig, optim: OptimConfig, world_size: int) -> dict[str, Any]:
    """The DeepSpeed JSON config for this learner."""
    zero: dict[str, Any] = {"stage": ds.zero_stage}
    if ds.offload_optimizer and ds.zero_stage > 0:
        zero["offload_optimizer"] = {"device": "cpu"}
    return {
        "train_micro_batch_size_per_gpu": optim.micro_batch_size,
        "gradient_accumulation_steps": optim.grad_accum,
        "train_batch_size": optim.micro_batch_size * optim.grad_accum * world_size,
        "gradient_clipping": optim.grad_clip,
        "zero_optimization": zero,
        "bf16": {"enabled": ds.precision == "bf16"},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def set_threads(res: ResourcesConfig, local_world_size: int) -> int:
    """torch intra-op threads: the configured number, else this node's cores split by workers."""
    n = res.torch_threads or max(1, (os.cpu_count() or 1) // max(1, local_world_size))
    torch.set_num_threads(n)
    return n


def prepare_model(path: str, cfg: ModelConfig, precision: str) -> torch.nn.Module:
    """Load the causal LM; apply gradient checkpointing and LoRA as configured."""
    from raypost.models.hf import load_causal_lm

    model = load_causal_lm(path, precision)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    if cfg.lora.enabled:
        from peft import LoraConfig, get_peft_model

        lora = cfg.lora
        model = get_peft_model(
            model,
            LoraConfig(
                r=lora.r,
                lora_alpha=lora.alpha,
                lora_dropout=lora.dropout,
                target_modules=lora.target_modules,
                task_type="CAUSAL_LM",
            ),
        )
    return model


def extensions_in_this_env() -> None:
    """Keep torch's JIT-built extensions in this virtual environment. DeepSpeed builds its CPU
    shared-memory allreduce op on a learner's first start (70-100 s here), into torch's cache,
    which by default is one per user (``~/.cache/torch_extensions/py311_cpu``): two environments
    with different torch or DeepSpeed builds would each rebuild it whenever the other had last.
    Nothing changes outside a venv (the system prefix may not be writable) or when the user set
    ``TORCH_EXTENSIONS_DIR``.

    The venv's ``ninja`` (a dependency of DeepSpeed) goes first on ``PATH``, as an activated venv
    has it: torch runs whichever ``ninja`` is found, and ninja 1.11 (Debian's) and 1.13 (PyPI's)
    hash the commands in the build log differently, so a process that found the other one rebuilt
    the op each time (20-25 s of a learner's start here)."""
    if sys.prefix == sys.base_prefix:
        return
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "torch_extensions"))
    tools = os.path.join(sys.prefix, "bin")
    path = os.environ.get("PATH", "")
    if os.path.isfile(os.path.join(tools, "ninja")) and path.split(os.pathsep)[0] != tools:
        os.environ["PATH"] = os.pathsep.join(p for p in (tools, path) if p)


def prebuild_comm_op() -> None:
    """Build DeepSpeed's CPU shared-memory allreduce op now (``make setup``), not in the first run."""
    from deepspeed.accelerator import get_accelerator

    extensions_in_this_env()
    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is not None:
        builder.load()


def init_distributed(backend: str | None = None, **kwargs: Any) -> None:
    """``deepspeed.init_distributed`` (gloo on CPU, NCCL on GPU), loading DeepSpeed's shm op
    from this venv's extension cache (``extensions_in_this_env``)."""
    import deepspeed

    extensions_in_this_env()
    deepspeed.init_distributed(dist_backend=backend or ("nccl" if torch.cuda.is_available() else "gloo"), **kwargs)


def build_engine(
    model: torch.nn.Module, optim: OptimConfig, ds: DeepSpeedConfig, total_steps: int, world_size: int
) -> Any:
    """deepspeed.initialize with torch AdamW and a transformers LR schedule (stepped by DeepSpeed)."""
    import deepspeed
    from transformers import get_scheduler

    init_distributed()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=optim.lr, betas=optim.betas, weight_decay=optim.weight_decay)
    name = {"cosine": "cosine", "linear": "linear", "constant": "constant_with_warmup"}[optim.scheduler]
    scheduler = get_scheduler(
        name, optimizer, num_warmup_steps=int(optim.warmup_ratio * total_steps), num_training_steps=max(1, total_steps)
    )
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=optimizer, lr_scheduler=scheduler, config=deepspeed_config(ds, optim, world_size)
    )
    return engine


def set_hyperparams(engine: Any, optim: OptimConfig) -> None:
    """Apply ``optim``'s lr and weight decay to a restored engine (PBT's explore changes them;
    a plain resume sets the values the checkpoint already holds). The schedule keeps its step:
    the lr becomes the new base lr times the schedule's factor at that step."""
    sched = engine.lr_scheduler
    sched.base_lrs = [optim.lr for _ in sched.base_lrs]
    for group, lr in zip(sched.optimizer.param_groups, sched.get_lr()):
        group["lr"], group["initial_lr"], group["weight_decay"] = lr, optim.lr, optim.weight_decay
    sched._last_lr = [g["lr"] for g in sched.optimizer.param_groups]


def backward_share(engine: Any, loss: torch.Tensor) -> None:
    """Backward of one micro-batch's share of a loss normalized over the global batch.

    The learners' losses divide by the size of the whole global batch (every micro-batch on
    every rank; see raypost.algos), so the shares add up to the step's loss. DeepSpeed would
    divide each micro-batch's loss by gradient_accumulation_steps and then averages gradients
    over the data-parallel ranks; this undoes both, so the step's gradient is the gradient of
    that sum, however the batch was split (tests/integration/test_learner_equivalence.py).
    """
    engine.backward(loss * engine.dp_world_size, scale_wrt_gas=False)


def full_state_dict(engine: Any, zero_stage: int) -> dict[str, torch.Tensor] | None:
    """The whole model's weights on rank 0 (ZeRO-3 gathers them; every rank must call); for a
    LoRA model, the base weights with the adapters merged, under the base model's key names."""
    import torch.distributed as dist

    if zero_stage == 3:
        return engine._zero3_consolidated_16bit_state_dict()
    if dist.is_initialized() and dist.get_rank() != 0:
        return None
    module = engine.module
    from raypost.models.lora import is_peft, merged_state_dict

    if is_peft(module):  # LoRA: the base weights with the adapters merged, as a replica serves them
        return merged_state_dict(module)
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def build_learner(
    cfg: Any,
    model_path: str,
    optim: OptimConfig,
    total_steps: int,
    world: int,
    local_world: int,
    load: Callable[[str, Any, str], torch.nn.Module] = prepare_model,
    rank: int = 0,
) -> tuple[Any, Any]:
    """Threads, seed, tokenizer and the DeepSpeed engine of one learner rank, under the process
    group already set up (Ray Train's, or any ``torch.distributed`` group: no Ray needed).

    ``cfg`` is a pipeline config with model/deepspeed/resources/run sections; ``load(path,
    cfg.model, precision)`` builds the model (default: the causal LM with LoRA/checkpointing).
    Returns (tokenizer, engine)."""
    from raypost.models.hf import load_tokenizer

    t0 = time.perf_counter()
    set_threads(cfg.resources, local_world)
    torch.manual_seed(cfg.run.seed)
    tokenizer = load_tokenizer(model_path)
    model = load(model_path, cfg.model, cfg.deepspeed.precision)
    t1 = time.perf_counter()
    engine = build_engine(model, optim, cfg.deepspeed, total_steps, world)
    if rank == 0:
        log.info(
            "learner ready: model loaded in %.1fs, DeepSpeed engine (ZeRO-%d, %d ranks) in %.1fs",
            t1 - t0,
            cfg.deepspeed.zero_stage,
            world,
            time.perf_counter() - t1,
        )
    return tokenizer, engine


def setup_learner(
    cfg: Any,
    model_path: str,
    optim: OptimConfig,
    total_steps: int,
    load: Callable[[str, Any, str], torch.nn.Module] = prepare_model,
) -> tuple[int, int, Any, Any]:
    """Inside a Ray Train worker: logging, then ``build_learner`` with the worker's ranks.
    Returns (rank, world size, tokenizer, engine)."""
    import ray.train

    from raypost.utils.logs import setup_logging

    setup_logging()
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    tokenizer, engine = build_learner(
        cfg, model_path, optim, total_steps, world, ctx.get_local_world_size(), load, rank
    )
    return rank, world, tokenizer, engine
