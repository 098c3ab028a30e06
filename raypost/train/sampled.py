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
from dataclasses import dataclass, field
from typing import Any

from raypost.rl.records import Sequence
from raypost.train import checkpointing
from raypost.train.collectives import broadcast_from_rank0
from raypost.train.loop import Learner, LoopConfig, Taken, Worker, _nothing, run_learner
from raypost.train.sync import push_weights
from raypost.weights import WeightChannel


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


@dataclass
class _Hooks:
    """The skeleton's hooks for a sampling learner on one rank."""

    sampler: Sampler
    rank: int
    world: int
    engine: Any
    zero_stage: int
    bucket_mb: int
    state: checkpointing.ControllerState
    chan: WeightChannel
    batch: list[Sequence] = field(default_factory=list)  # the whole global batch of the step, for ``extra``

    def push(self) -> float:
        return push_weights(
            self.engine, self.zero_stage, self.state.weight_version, self.chan, self.rank, self.bucket_mb
        )

    def start(self) -> None:
        self.push()  # the restored weights
        if self.rank == 0:
            self.sampler.start()

    def take(self, st: checkpointing.ControllerState) -> Taken:
        got = (*self.sampler.take(st), st.cursor) if self.rank == 0 else None
        self.batch, metrics, st.cursor = broadcast_from_rank0(got, self.rank)
        return Taken(self.batch[self.rank :: self.world], [s.sample_id for s in self.batch], metrics)

    def after(self, st: checkpointing.ControllerState, metrics: dict[str, float], t0: float) -> dict[str, float]:
        out = self.acks(st.weight_version) if self.rank == 0 else {}
        st.weight_version += 1
        out["push_s"] = self.push()
        if self.rank == 0:
            self.sampler.advance(st.weight_version)
        out.update(self.sampler.extra(self.batch, {**metrics, **out}, time.perf_counter() - t0))
        return {**out, "step_s": time.perf_counter() - t0, "weight_version": st.weight_version}

    def acks(self, version: int) -> dict[str, float]:
        """How many replicas said they serve ``version`` (the one this step's fresh samples came
        from), of those heard from lately, and the seconds asking took (``ack_s``: its share of
        ``step_s`` is what the acknowledgements cost the learner)."""
        t0 = time.perf_counter()
        served = self.chan.served_versions()
        return {
            "replicas_on_version": sum(v == version for v in served.values()),
            "replicas_seen": len(served),
            "ack_s": time.perf_counter() - t0,
        }

    def stop(self) -> None:
        try:
            if self.rank == 0:
                self.sampler.stop()
        finally:
            self.chan.stop_serving()


def run_steps(
    cfg: Any,
    lc: LoopConfig,
    rank: int,
    world: int,
    engine: Any,
    tok: Any,
    state: checkpointing.ControllerState,
    sampler: Sampler,
    extra: dict[str, Any] | None = None,
) -> None:
    """The loop, from the restored ``state`` to ``sampler.steps`` (``lc``: the learner's loop
    config, with the weight channel; ``cfg``: the pipeline config; ``extra``: more engines to
    checkpoint, by tag)."""
    zero = cfg.deepspeed.zero_stage
    hooks = _Hooks(sampler, rank, world, engine, zero, cfg.rollout.weight_bucket_mb, state, lc.channel)
    learner = Learner(
        phase=sampler.phase,
        label=sampler.label,
        steps=sampler.steps,
        take=hooks.take,
        learn=sampler.learn,
        after=hooks.after,
        shown=sampler.shown,
        start=hooks.start,
        stop=hooks.stop,
    )
    worker = Worker(
        rank=rank,
        engine=engine,
        tokenizer=tok,
        zero_stage=zero,
        run_dir=lc.run_dir,
        run=cfg.run,
        config=lc.cfg,
        extra=extra or {},
    )
    run_learner(learner, worker, state)
