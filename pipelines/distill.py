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
  python pipelines/distill.py                                  # offline default: offline_kd
  python pipelines/distill.py --distill.mode seq_kd --run.name distill-seq
  python pipelines/distill.py --config examples/distill_on_policy.yaml
  python pipelines/distill.py --teacher.path runs/distill/teacher/<checkpoint>/hf --distill.divergence jsd
  python pipelines/distill.py --teacher.path Qwen/Qwen2.5-1.5B-Instruct --model Qwen/Qwen2.5-0.5B-Instruct \\
      --dataset ../shared/data/gsm8k/train.jsonl --data.eval_path ../shared/data/gsm8k/test.jsonl
  ray job submit --working-dir . -- $PWD/.venv/bin/python pipelines/distill.py --run.name my-kd
Re-running the same command resumes: finished phases are kept, an unfinished one resumes from
its latest checkpoint.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from raypost.config import ConfigError, load_config  # noqa: E402
from raypost.config.distill import DistillConfig  # noqa: E402

ALIASES = {"model": "model.path", "teacher": "teacher.path", "dataset": "data.path", "name": "run.name"}


def main(argv: list[str]) -> dict:
    cfg = load_config(DistillConfig, argv, aliases=ALIASES)

    import logging
    import time

    from raypost.config import ModelConfig
    from raypost.phases import data as data_phase
    from raypost.phases import distill as distill_phase
    from raypost.utils.report import finish_run

    log = logging.getLogger("raypost")
    t0 = time.time()
    run_dir = data_phase.start_run(cfg)
    distill_phase.check_placement(cfg)

    # Data, tokenized with the teacher's tokenizer (the tiny teacher's base is built from the data).
    teacher_base, data = data_phase.prepare(cfg.data, ModelConfig(path=cfg.teacher.path, tiny=cfg.teacher.tiny),
                                            run_dir)

    # Teacher, then a student with the same tokenizer.
    teacher = distill_phase.teacher(cfg, teacher_base, data, run_dir)
    teacher_path = teacher.model_path
    student_path = distill_phase.student_base(cfg, teacher_path, run_dir)

    # Baseline: the student on the gold answers. Then the distillation mode.
    phases = {"teacher": teacher}
    results = {"teacher": distill_phase.evaluate(cfg, teacher_path, data, run_dir)}
    if cfg.distill.baseline:
        phases["baseline"] = distill_phase.baseline(cfg, student_path, data, run_dir)
        results["baseline"] = distill_phase.evaluate(cfg, phases["baseline"].model_path, data, run_dir)
    mode = phases[cfg.distill.mode] = distill_phase.distill(cfg, teacher_path, student_path, data, run_dir)
    results["student"] = distill_phase.evaluate(cfg, mode.model_path, data, run_dir)
    for who, res in results.items():
        log.info("held-out accuracy %-8s %.3f (%d params)", who, res["accuracy"], res["params"])

    teacher_acc = results["teacher"]["accuracy"]
    report = {
        "pipeline": "distill", "mode": cfg.distill.mode, "config": cfg.model_dump(mode="json"),
        "model_path": mode.model_path, "teacher_path": teacher_path, "data": {**data.counts, **mode.info},
        "heldout_accuracy": {who: res["accuracy"] for who, res in results.items()},
        "student_vs_teacher": results["student"]["accuracy"] / teacher_acc if teacher_acc else None,
        "params": {who: res["params"] for who, res in results.items()}, "heldout_n": results["student"]["n"],
        "shapes": distill_phase.student_info(cfg, teacher_path, student_path),
        "samples": results["student"]["samples"], "phase_s": {k: p.wall_s for k, p in phases.items()},
        "wall_s": time.time() - t0,
    }
    finish_run(run_dir, report, "student/metrics.jsonl", ["loss", "kd", "eval_loss"], "loss.png",
               f"distill ({cfg.distill.mode})")
    log.info("report: %s", run_dir / "report.json")
    return report


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except ConfigError as err:
        sys.exit(f"raypost: {err}")
