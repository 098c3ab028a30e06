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
  python pipelines/sft.py                                   # offline default
  python pipelines/sft.py --config examples/sft_tiny.yaml --optim.lr 3e-4
  python pipelines/sft.py --model Qwen/Qwen2.5-0.5B-Instruct --dataset ../shared/data/gsm8k/train.jsonl
  ray job submit --working-dir . -- $PWD/.venv/bin/python pipelines/sft.py --run.name my-sft
Re-running the same command (same run.name and run.storage_path) resumes from the latest checkpoint.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from raypost.config import ConfigError, SFTConfig, load_config  # noqa: E402

ALIASES = {"model": "model.path", "dataset": "data.path", "name": "run.name"}


def main(argv: list[str]) -> dict:
    cfg = load_config(SFTConfig, argv, aliases=ALIASES)

    import logging
    import time

    from raypost.phases import data as data_phase
    from raypost.phases import sft as sft_phase
    from raypost.utils.report import finish_run

    log = logging.getLogger("raypost")
    t0 = time.time()
    run_dir = data_phase.start_run(cfg)

    # Data and model: Ray Data preprocessing; the tiny model is built from the training text.
    model_path, data = data_phase.prepare(cfg.data, cfg.model, run_dir)

    # Train on Ray Train + DeepSpeed.
    sft = sft_phase.run_sft(cfg, model_path, data, run_dir)

    # Held-out greedy accuracy of the exported model.
    evaluation = sft_phase.evaluate(cfg, sft.model_path, data, run_dir)
    log.info("held-out accuracy %.3f on %d questions", evaluation["accuracy"], evaluation["n"])

    report = {
        "pipeline": "sft", "config": cfg.model_dump(mode="json"), "model_path": sft.model_path,
        "data": data.counts, "steps": sft.steps, "final_metrics": sft.metrics,
        "heldout_accuracy": evaluation["accuracy"], "heldout_n": evaluation["n"], "samples": evaluation["samples"],
        "tokens_per_s": sft.metrics.get("tokens_per_s"), "train_wall_s": sft.wall_s, "wall_s": time.time() - t0,
    }
    finish_run(run_dir, report, "metrics.jsonl", ["loss", "eval_loss", "tokens_per_s"], "loss.png", "SFT")
    log.info("report: %s", run_dir / "report.json")
    return report


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except ConfigError as err:
        sys.exit(f"raypost: {err}")
