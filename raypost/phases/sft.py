"""Phase: supervised fine-tuning on Ray Train + DeepSpeed, then held-out accuracy."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raypost.config import SFTConfig
from raypost.data import preprocess
from raypost.data.teacher import TeacherSignal
from raypost.eval import heldout_accuracy
from raypost.phases.data import PreparedData
from raypost.train import checkpointing
from raypost.train.loop import LoopConfig
from raypost.train.sft_loop import sft_loop
from raypost.train.trainer import fit, learner_request, plan_steps
from raypost.utils.cluster import check_resources

log = logging.getLogger("raypost")


@dataclass
class SFTResult:
    model_path: str  # the HF export (present once the run reached its last step)
    steps: int  # the run's planned total
    wall_s: float
    metrics: dict[str, Any] = field(default_factory=dict)
    checkpoint_path: str = ""  # the run's latest checkpoint


def run_sft(
    cfg: SFTConfig,
    model_path: str,
    data: PreparedData,
    run_dir: Path,
    teacher: TeacherSignal | None = None,
    start_from: str | None = None,
    stop_at: int | None = None,
    report_to_tune: bool = True,
) -> SFTResult:
    """Train; returns the exported HF model (inside the final checkpoint) and its metrics.
    With ``teacher``, the packed rows get the teacher's top-k and the loss is offline KD.
    ``start_from`` (a checkpoint of another run) and ``stop_at`` (a step) run one segment of
    the schedule: PBT's trials (raypost.tune.trials), which report to Tune themselves
    (``report_to_tune=False``)."""
    check_resources({"resources (learner)": learner_request(cfg.resources)})
    rows = preprocess.sft_rows(data.train, cfg.data, cfg.train.epochs, cfg.run.seed)
    total = plan_steps(rows.count(), cfg.optim, cfg.resources, cfg.train.max_steps, "rows")
    pass_info: dict[str, Any] = {}
    if teacher is not None:  # the teacher annotates only the rows the run will train on
        used = total * cfg.optim.micro_batch_size * cfg.optim.grad_accum * cfg.resources.num_workers
        rows = rows.limit(used).materialize()
        rows, pass_info = _teacher_pass(teacher, rows, run_dir)
    eval_rows = preprocess.sft_rows(data.eval, cfg.data.model_copy(update={"pack": False}), 1, cfg.run.seed)
    log.info("sft: %d packed rows, %d steps on %d workers", rows.count(), total, cfg.resources.num_workers)
    t0 = time.time()
    result = fit(
        sft_loop,
        LoopConfig(
            cfg=cfg.model_dump(mode="json"),
            model_path=model_path,
            run_dir=str(run_dir),
            total_steps=total,
            kd=teacher.kd if teacher else None,
            start_from=start_from,
            stop_at=stop_at,
        ),
        cfg.resources,
        cfg.run,
        {"train": rows, "eval": eval_rows},
        report_to_tune=report_to_tune,
    )
    if result.error is not None:
        raise result.error
    ckpt_dir = Path(result.checkpoint.path)
    metrics = dict(result.metrics or {})
    if pass_info:
        metrics["mode_info"] = {"teacher_pass": {**pass_info, "per_step_s": pass_info["seconds"] / total}}
    return SFTResult(str(ckpt_dir / checkpointing.HF_DIR), total, time.time() - t0, metrics, str(ckpt_dir))


def _teacher_pass(teacher: TeacherSignal, rows: Any, run_dir: Path) -> tuple[Any, dict[str, Any]]:
    """The rows with the teacher's top-k (offline KD), and what the pass cost: its seconds and
    the top-k's size as Parquet, written to ``run_dir/teacher_topk`` by the run that made the pass
    (0 s when a run reuses an earlier run's pass through ``teacher.cache``)."""
    from raypost.data.teacher import write_topk

    t0, reused = time.time(), teacher.cache is not None and "rows" in teacher.cache
    rows = teacher.annotate(rows)
    seconds = 0.0 if reused else time.time() - t0
    took = "reused from this process's earlier pass" if reused else f"in {seconds:.1f}s"
    log.info("teacher top-%d over %d packed rows %s", teacher.top_k, rows.count(), took)
    cache = teacher.cache if teacher.cache is not None else {}
    if "size" not in cache:  # written once: runs that reuse the pass reuse its Parquet too
        cache["size"] = write_topk(rows, run_dir / "teacher_topk", teacher.top_k)
    size = cache["size"]
    log.info(
        "teacher top-%d: %d tokens, %.1f MB as Parquet (%.0f bytes a token)",
        teacher.top_k,
        size["tokens"],
        size["bytes"] / 2**20,
        size["bytes"] / max(1, size["tokens"]),
    )
    return rows, {"seconds": seconds, "reused": reused, "top_k": teacher.top_k, **size}


def evaluate(cfg: SFTConfig, model_path: str, data: PreparedData) -> dict[str, Any]:
    """Held-out greedy accuracy (eval.engine: transformers, or a vLLM replica at rollout defaults)."""
    return heldout_accuracy(model_path, data.eval_rows(cfg.data.max_eval_samples), cfg.eval)
