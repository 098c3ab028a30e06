"""Distillation on Ray: a teacher's knowledge into a smaller student that shares its tokenizer.

What it does, in order:
  1. parse and validate the config (YAML + dotted CLI overrides) before any heavy import;
  2. Ray Data preprocesses the data with the teacher's tokenizer (the tiny teacher is built
     first when no --teacher.path is given);
  3. the teacher: --teacher.path, or the tiny model SFT-trained here with the SFT learner;
  4. the student: --model, or a tiny model of about a quarter of the teacher's parameters
     built with the teacher's tokenizer (a different tokenizer is an error);
  5. the baseline: the same student SFT-trained on the gold answers (distill.baseline);
  6. the distillation mode (``--distill.mode``), trained on Ray Train + DeepSpeed:
       offline_kd  a Ray Data pass stores the teacher's top-k log-probs per token; the student
                   fits them (forward KL, reverse KL or generalized JSD, with temperature)
                   mixed with cross-entropy on the labels;
       seq_kd      the teacher answers every training prompt on a Serve vLLM replica; the
                   student is SFT-trained on those answers (by default only the right ones);
       on_policy   the student samples on a Serve vLLM replica that gets its weights every
                   step; a teacher replica scores the sampled tokens (vLLM prompt log-probs);
                   the loss is GKD's divergence on the teacher's top-k, or the per-token
                   reverse KL used as a dense advantage;
  7. held-out greedy accuracy of teacher, baseline and student; report.json and loss.png.

Departures from the papers: offline KD and on-policy GKD keep only the teacher's top-k
(k=16 by default) and renormalize the teacher on it (Hinton et al. and GKD use the full
softmax); seq-KD decodes greedily (Kim & Rush use beam search), drops answers the teacher did
not finish and, by default, those with a wrong final answer; on-policy runs use only student
samples (GKD's lambda = 1) and start from the SFT baseline (distill.warm_start).

Launch:
  raypost distill                                  # offline default: offline_kd
  raypost distill --distill.mode seq_kd --run.name distill-seq
  raypost distill --config examples/distill_on_policy.yaml
  raypost distill --teacher.path runs/distill/teacher/<checkpoint>/hf --distill.divergence jsd
  raypost distill --teacher.path Qwen/Qwen2.5-1.5B-Instruct --model Qwen/Qwen2.5-0.5B-Instruct \\
      --dataset ../shared/data/gsm8k/train.jsonl --data.eval_path ../shared/data/gsm8k/test.jsonl
  ray job submit --working-dir . -- $PWD/.venv/bin/raypost distill --run.name my-kd
Re-running the same command resumes: finished phases are kept, an unfinished one resumes from
its latest checkpoint.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from raypost.config.distill import DistillConfig
from raypost.pipelines.registry import ALIASES, PBTHooks, Pipeline, Requests, Segment
from raypost.pipelines.sft import check_metric

log = logging.getLogger("raypost")


def run(cfg: DistillConfig, run_dir: Path) -> dict[str, Any]:
    from raypost.config import ModelConfig
    from raypost.phases import data as data_phase
    from raypost.phases import distill as distill_phase
    from raypost.utils.report import finish_run

    t0 = time.time()

    # Data, tokenized with the teacher's tokenizer (the tiny teacher's base is built from the data).
    teacher_base, data = data_phase.prepare(
        cfg.data, ModelConfig(path=cfg.teacher.path, tiny=cfg.teacher.tiny), run_dir
    )

    # Teacher, then a student with the same tokenizer.
    teacher = distill_phase.teacher(cfg, teacher_base, data, run_dir)
    teacher_path = teacher.model_path
    student_path = distill_phase.student_base(cfg, teacher_path, run_dir)

    # Baseline: the student on the gold answers. Then the distillation mode.
    phases = {"teacher": teacher}
    results = {"teacher": distill_phase.evaluate(cfg, teacher_path, data)}
    if cfg.distill.baseline:
        phases["baseline"] = distill_phase.baseline(cfg, student_path, data, run_dir)
        results["baseline"] = distill_phase.evaluate(cfg, phases["baseline"].model_path, data)
    mode = phases[cfg.distill.mode] = distill_phase.distill(cfg, teacher_path, student_path, data, run_dir)
    results["student"] = distill_phase.evaluate(cfg, mode.model_path, data)
    for who, res in results.items():
        log.info("held-out accuracy %-8s %.3f (%d params)", who, res["accuracy"], res["params"])

    teacher_acc = results["teacher"]["accuracy"]
    report = {
        "pipeline": "distill",
        "mode": cfg.distill.mode,
        "config": cfg.model_dump(mode="json"),
        "model_path": mode.model_path,
        "teacher_path": teacher_path,
        "data": {**data.counts, **mode.info},
        "heldout_accuracy": {who: res["accuracy"] for who, res in results.items()},
        "student_vs_teacher": results["student"]["accuracy"] / teacher_acc if teacher_acc else None,
        "params": {who: res["params"] for who, res in results.items()},
        "heldout_n": results["student"]["n"],
        "shapes": distill_phase.student_info(cfg, teacher_path, student_path),
        "samples": results["student"]["samples"],
        "phase_s": {k: p.wall_s for k, p in phases.items()},
        "wall_s": time.time() - t0,
    }
    finish_run(
        run_dir,
        report,
        "student/metrics.jsonl",
        ["loss", "kd", "eval_loss"],
        "loss.png",
        f"distill ({cfg.distill.mode})",
    )
    return report


def requests(cfg: DistillConfig) -> Requests:
    from raypost.phases.distill import peak_request

    return {"learner or teacher": peak_request(cfg)}


def check(cfg: DistillConfig) -> None:
    from raypost.phases.distill import check_placement

    check_placement(cfg)


def _prepared(cfg: DistillConfig, run_dir: Path) -> tuple[Any, str]:
    """(data, the student's base) from the sweep's shared teacher."""
    from raypost.config import ModelConfig
    from raypost.phases import data as data_phase
    from raypost.phases import distill as distill_phase

    _, data = data_phase.prepare(cfg.data, ModelConfig(path=cfg.teacher.path), run_dir)
    return data, distill_phase.student_base(cfg, cfg.teacher.path, run_dir)


def trial(cfg: DistillConfig, run_dir: Path) -> None:
    """A Tune trial: the distillation mode alone, from the sweep's shared teacher. The student
    run is the trial's run folder itself, where Tune's restore looks for it."""
    from raypost.phases import distill as distill_phase

    data, student = _prepared(cfg, run_dir)
    distill_phase.MODES.get_fn(cfg.distill.mode)(cfg, cfg.teacher.path, student, data, run_dir)


def shared_start(cfg: DistillConfig, sweep_dir: Path) -> dict[str, Any]:
    """A sweep's teacher, trained once: every trial gets its path."""
    if cfg.teacher.path is not None:
        return {"distill": {"baseline": False}}
    from raypost.config import ModelConfig
    from raypost.phases import data as data_phase
    from raypost.phases import distill as distill_phase

    run_dir = sweep_dir / "teacher"
    run_dir.mkdir(parents=True, exist_ok=True)
    base, data = data_phase.prepare(cfg.data, ModelConfig(path=cfg.teacher.path, tiny=cfg.teacher.tiny), run_dir)
    teacher = distill_phase.teacher(cfg, base, data, run_dir).model_path
    return {"teacher": {"path": teacher}, "distill": {"baseline": False}}


def pbt_segments(cfg: DistillConfig, run_dir: Path) -> Segment:
    """Offline KD from the sweep's shared teacher. The teacher pass runs once per trial; each
    segment sends the learner its own (possibly perturbed) KD parameters."""
    from raypost.phases import distill as distill_phase
    from raypost.phases.sft import run_sft

    data, student = _prepared(cfg, run_dir)
    cache: dict[str, Any] = {}

    def segment(seg: DistillConfig, out: Path, start: str | None, stop: int) -> Any:
        return run_sft(
            distill_phase.student_sft(seg, out),
            student,
            data,
            out,
            teacher=distill_phase.kd_signal(seg, seg.teacher.path, cache),
            start_from=start,
            stop_at=stop,
            report_to_tune=False,
        )

    return segment


def pbt_check(base: dict[str, Any]) -> None:
    distill = base.get("distill")
    mode = distill.get("mode", "offline_kd") if isinstance(distill, dict) else "offline_kd"
    if mode != "offline_kd":
        raise ValueError(
            f"scheduler pbt distills in mode offline_kd only (base distill.mode is {mode}); "
            f"use asha or hyperband for {mode}"
        )


PIPELINE = Pipeline(
    name="distill",
    summary="distill a teacher into a smaller student (offline KD, seq-KD, on-policy GKD)",
    config=DistillConfig,
    run=run,
    requests=requests,
    check=check,
    aliases={**ALIASES, "teacher": "teacher.path"},
    trial=trial,
    shared_start=shared_start,
    check_metric=check_metric,
    # offline KD's loss parameters are sent to the learner afresh by every segment
    pbt=PBTHooks(
        mutable=("optim.lr", "optim.weight_decay", "distill.beta", "distill.temperature", "distill.kd_weight"),
        segments=pbt_segments,
        check=pbt_check,
    ),
)
