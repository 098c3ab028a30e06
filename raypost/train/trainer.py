"""Run a learner loop on Ray Train (TorchTrainer) with placement and storage from config."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray.data
import ray.train
from ray.train.torch import TorchConfig, TorchTrainer

from raypost.config import ResourcesConfig, RunConfig
from raypost.train.loop import LoopConfig
from raypost.train.snapshot import SnapshotKeeper, restore_snapshot
from raypost.utils import storage
from raypost.utils.alloc import jemalloc_env


def run_dir(run: RunConfig) -> Path:
    """The run's folder: Ray Train's checkpoints, metrics.jsonl, rejects, report (for a run stored
    at a URI, its local working copy: ``raypost.utils.storage``)."""
    return storage.working_copy(run.storage_path) / run.name


def worker_resources(res: ResourcesConfig) -> dict[str, float]:
    out = {"CPU": res.cpus_per_worker, **res.ray_resources}
    if res.gpus_per_worker:
        out["GPU"] = res.gpus_per_worker
    return out


def learner_request(res: ResourcesConfig) -> dict[str, float]:
    """What the whole learner (every worker) reserves."""
    return {k: v * res.num_workers for k, v in worker_resources(res).items()}


def plan_steps(examples: int, optim: Any, resources: ResourcesConfig, max_steps: int | None, what: str) -> int:
    """Optimizer steps over ``examples`` (all epochs' rows, packed rows or pairs): full global
    batches of micro_batch_size x grad_accum x num_workers, capped by ``max_steps``."""
    global_batch = optim.micro_batch_size * optim.grad_accum * resources.num_workers
    steps = examples // global_batch
    if steps == 0:
        raise ValueError(
            f"{examples} training {what} make no full global batch of {global_batch} "
            "(optim.micro_batch_size x optim.grad_accum x resources.num_workers); lower one of them"
        )
    return min(steps, max_steps or steps)


def fit(
    loop: Callable[[dict[str, Any]], None],
    loop_config: LoopConfig,
    res: ResourcesConfig,
    run: RunConfig,
    datasets: dict[str, ray.data.Dataset],
    name: str | None = None,
    report_to_tune: bool = True,
) -> ray.train.Result:
    """TorchTrainer.fit(); re-running with the same run name and storage resumes.

    Datasets are not split: every worker reads the same deterministic order and takes its
    own rows of each global batch, so a checkpoint's cursor resumes exactly.
    """
    from ray.tune.trainable.trainable_fn_utils import _in_tune_session

    # Inside a Tune trial, every report (metrics + checkpoint path) also goes to Tune, unless the
    # trial reports itself (PBT: one report with a Tune checkpoint per segment).
    callbacks = []
    if report_to_tune and _in_tune_session():
        from ray.tune.integration.ray_train import TuneReportCallback

        callbacks.append(TuneReportCallback())
    root = storage.working_copy(run.storage_path)
    if storage.remote_of(root) is None:  # a bucket's put is whole or absent: only files can be torn
        restore_snapshot(root / (name or run.name))
        callbacks.append(SnapshotKeeper(str(root / (name or run.name))))
    opts = ray.train.DataConfig.default_ingest_options()
    opts.preserve_order = True
    trainer = TorchTrainer(
        loop,
        train_loop_config={"loop": loop_config},
        scaling_config=ray.train.ScalingConfig(
            num_workers=res.num_workers, use_gpu=res.gpus_per_worker > 0, resources_per_worker=worker_resources(res)
        ),
        run_config=ray.train.RunConfig(
            name=name or run.name,
            **storage.ray_storage(root),
            failure_config=ray.train.FailureConfig(max_failures=run.max_failures),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=run.keep_checkpoints),
            callbacks=callbacks,
            worker_runtime_env=jemalloc_env(res.jemalloc, res.jemalloc_decay_ms),
        ),
        datasets=datasets,
        dataset_config=ray.train.DataConfig(datasets_to_split=[], execution_options=opts),
        torch_config=TorchConfig(backend="nccl" if res.gpus_per_worker > 0 else "gloo"),
    )
    result = trainer.fit()
    # At a URI, the checkpoint the run ended with comes into the working copy: the next phase reads it.
    return dataclasses.replace(
        result, checkpoint=storage.local_checkpoint(result.checkpoint, root / (name or run.name))
    )
