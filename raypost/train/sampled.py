"""The learners that sample from Serve replicas, GRPO and on-policy distillation, on the one
step skeleton (``raypost.train.loop``). What they add (``Sampler``):

1. before the first step, the restored weights are pushed, so the replicas serve them before
   rank 0 starts sampling (``start``);
2. per step, rank 0 takes the next batch (``take``) and broadcasts it with its metrics and data
   cursor; every rank learns its slice (``learn``); the weights are pushed as the next version
   (every rank: ZeRO-3 gathers together); rank 0 then tells its producer (``advance``);
3. however the loop ends: rank 0's producer stopped (``stop``) and the weight server closed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from raypost.rl.records import Sequence
from raypost.serve.channel import rollout_channel
from raypost.train import checkpointing
from raypost.train.collectives import broadcast_from_rank0
from raypost.train.loop import Learner, Taken, Worker, _nothing, run_learner
from raypost.train.sync import push_weights


@dataclass
class Sampler:
    """What a sampling learner adds to the skeleton."""

    phase: str  # the "phase" metric and the checkpoint-rewind key: "grpo", "on_policy"
    label: str  # the progress lines' name
    steps: int
    shown: tuple[str, ...]  # metrics in the progress line, when present
    take: Callable[[checkpointing.ControllerState], tuple[list[Sequence], dict[str, float]]]  # rank 0; moves the cursor
    learn: Callable[[list[Sequence]], dict[str, float]]  # every rank, on its slice: one optimizer step
    # every rank, after the push: metrics from the batch, its metrics and the step's seconds so far
    extra: Callable[[list[Sequence], dict[str, float], float], dict[str, float]] = lambda *_: {}
    start: Callable[[], None] = _nothing  # rank 0, once the replicas serve the restored weights
    advance: Callable[[int], None] = _nothing  # rank 0, after each push: the version now served
    stop: Callable[[], None] = _nothing  # rank 0, however the loop ends


def run_steps(
    cfg: Any,
    config: dict[str, Any],
    rank: int,
    world: int,
    engine: Any,
    tok: Any,
    state: checkpointing.ControllerState,
    sampler: Sampler,
) -> None:
    """The loop, from the restored ``state`` to ``sampler.steps`` (``config``: the Ray Train
    loop config, with run_dir and weights_dir; ``cfg``: the pipeline config)."""
    zero, bucket_mb = cfg.deepspeed.zero_stage, cfg.rollout.weight_bucket_mb
    chan = rollout_channel(cfg.rollout, config["weights_dir"])
    batch: list[list[Sequence]] = [[]]  # the whole global batch of the step, for ``extra``

    def push() -> float:
        return push_weights(engine, zero, state.weight_version, chan, rank, bucket_mb)

    def start() -> None:
        push()  # the restored weights
        if rank == 0:
            sampler.start()

    def take(st: checkpointing.ControllerState) -> Taken:
        got = (*sampler.take(st), st.cursor) if rank == 0 else None
        seqs, metrics, st.cursor = broadcast_from_rank0(got, rank)
        batch[0] = seqs
        return Taken(seqs[rank::world], [s.sample_id for s in seqs], metrics)

    def after(st: checkpointing.ControllerState, metrics: dict[str, float], t0: float) -> dict[str, float]:
        st.weight_version += 1
        out = {"push_s": push()}
        if rank == 0:
            sampler.advance(st.weight_version)
        out.update(sampler.extra(batch[0], {**metrics, **out}, time.perf_counter() - t0))
        return {**out, "step_s": time.perf_counter() - t0, "weight_version": st.weight_version}

    def stop() -> None:
        try:
            if rank == 0:
                sampler.stop()
        finally:
            chan.stop_serving()

    learner = Learner(
        phase=sampler.phase,
        label=sampler.label,
        steps=sampler.steps,
        take=take,
        learn=sampler.learn,
        after=after,
        shown=sampler.shown,
        start=start,
        stop=stop,
    )
    worker = Worker(
        rank=rank,
        engine=engine,
        tokenizer=tok,
        zero_stage=zero,
        run_dir=config["run_dir"],
        run=cfg.run,
        config=config["cfg"],
    )
    run_learner(learner, worker, state)
