"""The step skeleton of the learners that sample from Serve replicas: GRPO and on-policy distillation.

Both loops run the same steps on every Ray Train worker; what differs is passed in (``Sampler``):

1. from the restored checkpoint (step, weight version, data cursor), push the restored weights,
   so the replicas serve them before rank 0 starts sampling (``start``);
2. per step: rank 0 takes the next batch (``take``) and broadcasts it with its metrics and data
   cursor; every rank learns its slice (``learn``); the weights are pushed as the next version
   (every rank: ZeRO-3 gathers together); rank 0 then tells its producer (``advance``), logs and
   records the trained samples; every ``run.checkpoint_every`` steps, and at the last, a checkpoint
   (the last with its HF export);
3. however the loop ends: rank 0's producer stopped (``stop``) and the weight server closed.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

from raypost.serve.channel import rollout_channel
from raypost.train import checkpointing
from raypost.train.sync import broadcast_from_rank0, push_weights
from raypost.utils.metrics import MetricsLogger, Progress



def _nothing(*_: Any) -> None:
    return None


@dataclass
class Sampler:
    """What a sampling learner adds to the skeleton."""

    phase: str  # the "phase" metric and the checkpoint-rewind key: "grpo", "on_policy"
    label: str  # the progress lines' name
    steps: int
    shown: tuple[str, ...]  # metrics in the progress line, when present
    take: Callable[[checkpointing.ControllerState], tuple[list[dict], dict[str, float]]]  # rank 0; moves the cursor
    learn: Callable[[list[dict]], dict[str, float]]  # every rank, on its slice: one optimizer step
    # every rank, after the push: metrics from the batch, its metrics and the step's seconds so far
    extra: Callable[[list[dict], dict[str, float], float], dict[str, float]] = lambda *_: {}
    start: Callable[[], None] = _nothing  # rank 0, once the replicas serve the restored weights
    advance: Callable[[int], None] = _nothing  # rank 0, after each push: the version now served
    stop: Callable[[], None] = _nothing  # rank 0, however the loop ends


def run_steps(cfg: Any, config: dict[str, Any], rank: int, world: int, engine: Any, tok: Any,
              state: checkpointing.ControllerState, sampler: Sampler) -> None:
    """The loop, from the restored ``state`` to ``sampler.steps`` (``config``: the Ray Train
    loop config, with run_dir and weights_dir; ``cfg``: the pipeline config)."""
    if rank == 0:
        checkpointing.rewind_on_start(config["run_dir"], state, sampler.phase)
    zero, bucket_mb = cfg.deepspeed.zero_stage, cfg.rollout.weight_bucket_mb
    chan = rollout_channel(cfg.rollout, config["weights_dir"])
    logger = MetricsLogger(config["run_dir"], rank == 0, cfg.run.wandb_mode, run_name=cfg.run.name,
                           config=config["cfg"])
    progress = Progress(sampler.steps, state.step, sampler.label)
    try:
        push_weights(engine, zero, state.weight_version, chan, rank, bucket_mb)  # the restored weights
        if rank == 0:
            sampler.start()
        while state.step < sampler.steps:
            t0 = time.perf_counter()
            batch = (*sampler.take(state), state.cursor) if rank == 0 else None
            seqs, metrics, state.cursor = broadcast_from_rank0(batch, rank)
            t1 = time.perf_counter()
            metrics.update(sampler.learn(seqs[rank::world]))
            metrics["train_s"] = time.perf_counter() - t1
            state.step, state.weight_version = state.step + 1, state.weight_version + 1
            metrics["push_s"] = push_weights(engine, zero, state.weight_version, chan, rank, bucket_mb)
            if rank == 0:
                sampler.advance(state.weight_version)
            metrics.update(sampler.extra(seqs, metrics, time.perf_counter() - t0))
            metrics.update(step_s=time.perf_counter() - t0, weight_version=state.weight_version, phase=sampler.phase)
            if rank == 0:
                _log_step(logger, progress, sampler, state, metrics, seqs, config["run_dir"], cfg.run.log_every)
            last = state.step == sampler.steps
            if last or state.step % cfg.run.checkpoint_every == 0:
                exporter = checkpointing.hf_exporter(engine, zero, tok, rank) if last else None
                checkpointing.save_and_report(engine, state, {"step": state.step, **metrics}, rank, exporter,
                                              config["run_dir"])
    finally:
        if rank == 0:
            sampler.stop()
        chan.stop_serving()
    logger.finish()


def _log_step(logger: MetricsLogger, progress: Progress, sampler: Sampler, state: checkpointing.ControllerState,
              metrics: dict[str, Any], seqs: list[dict], run_dir: str, log_every: int) -> None:
    logger.log(metrics, state.step)
    checkpointing.log_trained(run_dir, state.step, [s["sample_id"] for s in seqs])
    if state.step % log_every == 0 or state.step == sampler.steps:
        shown = {k: metrics[k] for k in sampler.shown if k in metrics}
        logging.getLogger(f"raypost.{sampler.phase}").info(progress.line(state.step, shown))
