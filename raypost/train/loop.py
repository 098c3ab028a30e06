"""The one step skeleton every learner runs: SFT (and offline KD), the reward model, GRPO and
on-policy distillation. Each learner supplies only what differs (``Learner``).

From the restored ``ControllerState`` (step, data cursor, weight version), on every rank:

1. rank 0 rewinds the run's logs to the restored step (``checkpointing.rewind_on_start``);
2. ``start``: e.g. the restored weights pushed to the replicas before sampling starts;
3. per step: ``take`` this rank's rows of the next global batch (moving the data cursor),
   ``learn`` one optimizer step on them, then ``after`` the step (a weight push, a held-out
   pass). Rank 0 records the samples the step trained and logs its metrics. Every
   ``run.checkpoint_every`` steps, at ``stop_at`` and at the last step, a checkpoint (the last
   with its HF export);
4. however the loop ends, ``stop``.

Every rank runs the same steps in the same order: ``take``, ``learn`` and ``after`` may make
collectives.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from raypost.train import checkpointing
from raypost.train.batches import rank_slice
from raypost.train.order import check_order, order_of
from raypost.utils.metrics import MetricsLogger, Progress

if TYPE_CHECKING:
    from raypost.utils.gate import StartGate
    from raypost.weights import WeightChannel


def _nothing(*_: Any) -> Any:
    return None


@dataclass(frozen=True)
class LoopConfig:
    """What crosses into every Ray Train worker of a learner (``trainer.fit`` passes it as
    ``train_loop_config={"loop": ...}``; a loop reads it back with ``LoopConfig.of``)."""

    cfg: dict[str, Any]  # the pipeline's config, model_dump(mode="json"): each loop validates its own class
    model_path: str  # the weights the learner starts from: an HF folder, an HF id or a raypost name
    run_dir: str  # the learner's folder: metrics, trained samples, Ray Train's checkpoints
    total_steps: int  # optimizer steps of the whole phase
    grad_accum: int = 1  # sampling learners: micro-batches per optimizer step and rank, from the batch size
    channel: WeightChannel | None = None  # sampling learners: where rank 0 pushes each weight version
    apps: dict[str, str] = field(default_factory=dict)  # on-policy: {"student": app name, "teacher": app name}
    gate: StartGate | None = None  # RL learners: every rank waits here before its first step (Serve apps up)
    kd: dict[str, Any] | None = None  # SFT with offline KD: KDParams fields (rows carry teacher columns)
    start_from: str | None = None  # SFT: a checkpoint folder to start from when the run has none (PBT)
    stop_at: int | None = None  # SFT: stop after this step's checkpoint, before total_steps (PBT segments)

    @staticmethod
    def of(config: dict[str, Any]) -> LoopConfig:
        return config["loop"]


@dataclass
class Taken:
    """One step's data as a rank sees it."""

    rows: list[Any]  # this rank's rows of the global batch
    sample_ids: list[str]  # every sample the global batch trains: the record resume is checked against
    metrics: dict[str, float] = field(default_factory=dict)  # the batch's own metrics (rollouts, waits)


@dataclass
class Learner:
    """What one learner adds to the skeleton."""

    phase: str  # the "phase" metric and the checkpoint-rewind key: "sft", "rm", "grpo", "on_policy"
    label: str  # the progress lines' name
    steps: int  # the step the run ends at
    take: Callable[[checkpointing.ControllerState], Taken | None]  # every rank; None: the data ran out
    learn: Callable[[list[Any]], dict[str, float]]  # every rank, on its rows: one optimizer step
    # every rank, after the step (state.step already advanced): (state, metrics so far, the
    # step's start on perf_counter) -> more metrics
    after: Callable[[checkpointing.ControllerState, dict[str, float], float], dict[str, float]] = lambda *_: {}
    shown: tuple[str, ...] | None = None  # metrics in the progress line, when present (None: all)
    every_step: bool = True  # log each step's metrics; else only at log_every steps and the last
    always: tuple[str, ...] = ()  # metrics logged at any step that has them (a held-out pass's)
    start: Callable[[], None] = _nothing
    stop: Callable[[], None] = _nothing
    stop_at: int | None = None  # stop after this step's checkpoint (PBT segments)


@dataclass(frozen=True)
class Worker:
    """One Ray Train worker's part in the loop."""

    rank: int
    engine: Any
    tokenizer: Any
    zero_stage: int
    run_dir: str
    run: Any  # the pipeline's RunConfig: log_every, checkpoint_every, wandb_mode, name
    config: dict[str, Any]  # the pipeline config as the metrics logger records it
    extra: dict[str, Any] = field(default_factory=dict)  # more engines checkpointed with it: {"critic": engine}


def run_learner(learner: Learner, worker: Worker, state: checkpointing.ControllerState) -> None:
    """The loop, from the restored ``state`` to ``learner.steps`` (or ``stop_at``)."""
    current = order_of(learner.phase, worker.config)
    if state.step:
        check_order(state.order, current, state.step)
    state.order = current
    if worker.rank == 0:
        checkpointing.rewind_on_start(worker.run_dir, state, learner.phase)
    logger = MetricsLogger(
        worker.run_dir, worker.rank == 0, worker.run.wandb_mode, run_name=worker.run.name, config=worker.config
    )
    progress = Progress(learner.steps, state.step, learner.label)
    try:
        learner.start()
        while state.step < learner.steps:
            t0 = time.perf_counter()
            taken = learner.take(state)
            if taken is None:
                break
            t1 = time.perf_counter()
            metrics = {**taken.metrics, **learner.learn(taken.rows)}
            metrics["train_s"] = time.perf_counter() - t1
            state.step += 1
            metrics.update(learner.after(state, metrics, t0))
            metrics.setdefault("step_s", time.perf_counter() - t0)
            metrics["phase"] = learner.phase
            if worker.rank == 0:
                checkpointing.log_trained(worker.run_dir, state.step, taken.sample_ids)
                _log(logger, progress, learner, state.step, metrics, worker.run.log_every)
            last = state.step >= learner.steps
            if last or state.step == learner.stop_at or state.step % worker.run.checkpoint_every == 0:
                _checkpoint(worker, state, metrics, last)
            if state.step == learner.stop_at:
                break
    finally:
        learner.stop()
    logger.finish()


PROGRESS_LINES = 10


def _log(
    logger: MetricsLogger, progress: Progress, learner: Learner, step: int, metrics: dict[str, Any], log_every: int
) -> None:
    last = step == learner.steps
    if learner.every_step or step % log_every == 0 or last:
        logger.log(metrics, step)
    else:
        kept = {k: metrics[k] for k in learner.always if k in metrics}
        if kept:
            logger.log({"phase": learner.phase, **kept}, step)
    # At most about PROGRESS_LINES progress lines a phase, however long: a 500-step warm-up does
    # not flood the terminal (every step's metrics are still in metrics.jsonl).
    if step % max(log_every, -(-learner.steps // PROGRESS_LINES)) == 0 or last:
        keys = learner.shown if learner.shown is not None else [k for k in metrics if k != "phase"]
        shown = {k: metrics[k] for k in keys if k in metrics}
        logging.getLogger(f"raypost.{learner.phase}").info(progress.line(step, shown))


def _checkpoint(worker: Worker, state: checkpointing.ControllerState, metrics: dict[str, Any], last: bool) -> None:
    exporter = (
        checkpointing.hf_exporter(worker.engine, worker.zero_stage, worker.tokenizer, worker.rank) if last else None
    )
    checkpointing.save_and_report(
        worker.engine, state, {"step": state.step, **metrics}, worker.rank, exporter, worker.run_dir, worker.extra
    )


def take_from(
    batches: Iterable[dict[str, Any]],
    state: checkpointing.ControllerState,
    rank: int,
    world: int,
    ids_of: Callable[[int, dict[str, Any]], list[str]],
    first: Callable[[], None] = _nothing,
) -> Callable[[checkpointing.ControllerState], Taken | None]:
    """``take`` for a learner that reads one global order of batches (SFT, reward model): each
    batch is a global batch (numpy columns), the cursor counts the global batches consumed, so
    a restored run skips the first ``state.cursor`` of them; every rank keeps its rows
    ``rank, rank + world, ...``. ``ids_of(index, batch)``: the sample ids a batch trains;
    ``first``: called when the first batch arrives (its data start-up logged)."""
    it = enumerate(batches)
    skip = state.cursor

    def take(st: checkpointing.ControllerState) -> Taken | None:
        for index, batch in it:
            if index == 0:
                first()
            if index < skip:
                continue  # consumed before the last checkpoint
            st.cursor = index + 1
            return Taken(rank_slice(batch, rank, world), ids_of(index, batch))
        return None

    return take
