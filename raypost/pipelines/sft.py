"""Supervised fine-tuning on Ray: Ray Data preprocessing, Ray Train + DeepSpeed learner.

What it does, in order:
  1. parse and validate the config (YAML + dotted CLI overrides) before any heavy import;
  2. Ray Data reads the rows, applies the tokenizer's chat template, tokenizes with
     completion-only labels, rejects malformed or over-long rows (to rejects.jsonl), and
     packs examples into max_seq_len rows (block-diagonal attention, no cross-talk);
  3. builds the offline tiny Qwen2 model and tokenizer (or loads --model);
  4. trains on Ray Train with DeepSpeed (ZeRO 0-3), checkpointing every k steps;
  5. greedy exact-match accuracy on held-out questions;
  6. writes report.json and loss.png into the run folder.

Departures from a plain HF Trainer: data order is global and deterministic (each epoch a
seeded shuffle), so a resumed run continues at the exact next batch.

Launch:
  raypost sft                                   # offline default
  raypost sft --config examples/sft_tiny.yaml --optim.lr 3e-4
  raypost sft --model Qwen/Qwen2.5-0.5B-Instruct --dataset ../shared/data/gsm8k/train.jsonl
  ray job submit --working-dir . -- $PWD/.venv/bin/raypost sft --run.name my-sft
Re-running the same command (same run.name and run.storage_path) resumes from the latest checkpoint.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from raypost.config import SFTConfig
from raypost.pipelines.registry import PBTHooks, Pipeline, Requests, Segment

log = logging.getLogger("raypost")


def run(cfg: SFTConfig, run_dir: Path) -> dict[str, Any]:
    from raypost.phases import data as data_phase
    from raypost.phases import sft as sft_phase
    from raypost.utils.report import finish_run

    t0 = time.time()
    # Data and model: Ray Data preprocessing; the tiny model is built from the training text.
    model_path, data = data_phase.prepare(cfg.data, cfg.model, run_dir)

    # Train on Ray Train + DeepSpeed.
    sft = sft_phase.run_sft(cfg, model_path, data, run_dir)

    # Held-out greedy accuracy of the exported model.
    evaluation = sft_phase.evaluate(cfg, sft.model_path, data)
    log.info("held-out accuracy %.3f on %d questions", evaluation["accuracy"], evaluation["n"])

    report = {
        "pipeline": "sft",
        "config": cfg.model_dump(mode="json"),
        "model_path": sft.model_path,
        "data": data.counts,
        "steps": sft.steps,
        "final_metrics": sft.metrics,
        "heldout_accuracy": evaluation["accuracy"],
        "heldout_n": evaluation["n"],
        "samples": evaluation["samples"],
        "tokens_per_s": sft.metrics.get("tokens_per_s"),
        "train_wall_s": sft.wall_s,
        "wall_s": time.time() - t0,
    }
    finish_run(run_dir, report, "metrics.jsonl", ["loss", "eval_loss", "tokens_per_s"], "loss.png", "SFT")
    return report


def requests(cfg: SFTConfig) -> Requests:
    from raypost.train.trainer import learner_request

    return {"resources (learner)": learner_request(cfg.resources)}


def trial(cfg: SFTConfig, run_dir: Path) -> None:
    """A Tune trial: the learner alone (the sweep's metric comes from its reports)."""
    from raypost.phases import data as data_phase
    from raypost.phases import sft as sft_phase

    model_path, data = data_phase.prepare(cfg.data, cfg.model, run_dir)
    sft_phase.run_sft(cfg, model_path, data, run_dir)


def pbt_segments(cfg: SFTConfig, run_dir: Path) -> Segment:
    from raypost.phases import data as data_phase
    from raypost.phases import sft as sft_phase

    model_path, data = data_phase.prepare(cfg.data, cfg.model, run_dir)

    def segment(seg: SFTConfig, out: Path, start: str | None, stop: int) -> Any:
        run_cfg = seg.run.model_copy(update={"storage_path": str(out.parent), "name": out.name})
        return sft_phase.run_sft(
            seg.model_copy(update={"run": run_cfg}),
            model_path,
            data,
            out,
            start_from=start,
            stop_at=stop,
            report_to_tune=False,
        )

    return segment


def check_metric(cfg: Any, metric: str) -> None:
    """Every Tune report (one per checkpoint) must carry the metric: the SFT learner (SFT and
    the distillation student) computes eval_loss every train.eval_every steps, so checkpoints
    must fall on those steps."""
    from raypost.config import ConfigError

    if metric != "eval_loss":
        return
    if not cfg.train.eval_loss:
        raise ConfigError("metric eval_loss needs the eval-loss passes: set base.train.eval_loss to true")
    every, ckpt = cfg.train.eval_every, cfg.run.checkpoint_every
    if every is None or ckpt % every:
        raise ConfigError(
            f"metric eval_loss is reported with each checkpoint, so base.run.checkpoint_every ({ckpt}) "
            f"must be a multiple of base.train.eval_every ({every}); set both, e.g. to 10"
        )


PIPELINE = Pipeline(
    name="sft",
    summary="supervised fine-tuning (Ray Data packing, Ray Train + DeepSpeed)",
    config=SFTConfig,
    run=run,
    requests=requests,
    trial=trial,
    check_metric=check_metric,
    # PBT may change the optimizer's lr and weight decay when a trial restarts from another's
    # checkpoint; the batch shape and schedule length are fixed by the checkpoint's data cursor.
    pbt=PBTHooks(mutable=("optim.lr", "optim.weight_decay"), segments=pbt_segments),
)
