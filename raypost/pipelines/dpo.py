"""DPO: offline preference optimization of a causal LM on Ray Train + DeepSpeed.

What it does, in order:
  1. parse and validate the config (YAML + dotted CLI overrides) before any heavy import;
  2. Ray Data builds or reads preference pairs (prompt, chosen, rejected), puts each prompt
     through the chat template and closes each response with EOS; bad rows become rejects;
  3. trains the policy against a frozen copy of itself with the registered loss (``dpo.loss``:
     sigmoid DPO, IPO, or the reference-free SimPO), checkpointing and resuming exactly;
  4. reports the held-out pairs before and after: the share whose chosen response the policy
     prefers, and the implicit reward's accuracy and margin, as TRL logs them.

Offline default: the tiny model built from the synthetic task's text, and pairs built from its
rows (chosen = the reference solution; rejected = a wrong final answer or another question's
solution; raypost/data/preference.py). Departures from the paper: the reference log-probs are
computed on the fly by a frozen reference on each worker (not precomputed); IPO uses per-token
log-ratios, as TRL does.

Launch:
  raypost dpo                                                      # offline default
  raypost dpo --config examples/dpo_tiny.yaml --dpo.loss simpo
  raypost dpo --model Qwen/Qwen2.5-0.5B-Instruct --dataset trl-lib/ultrafeedback_binarized \
      --data.source hf --pairs.build false --optim.lr 5e-7
  ray job submit --working-dir . -- $PWD/.venv/bin/raypost dpo --run.name my-dpo
Re-running the same command (same run.name and run.storage_path) resumes from the latest checkpoint.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from raypost.config.dpo import DPOConfig
from raypost.pipelines.registry import Pipeline, Requests

log = logging.getLogger("raypost")


def run(cfg: DPOConfig, run_dir: Path) -> dict[str, Any]:
    from raypost.phases import dpo as dpo_phase
    from raypost.train.dpo_loop import START_FILE
    from raypost.utils.report import finish_run

    t0 = time.time()

    # The policy and the preference pairs (Ray Data).
    model_path, train_pairs, eval_pairs, counts = dpo_phase.prepare(cfg, run_dir)

    # DPO on Ray Train + DeepSpeed; held-out pairs before the first step and after the last.
    trained, train_s, metrics = dpo_phase.train(cfg, model_path, train_pairs, eval_pairs, run_dir)
    before = json.loads((run_dir / START_FILE).read_text())
    after = {k: metrics[k] for k in before if k in metrics}
    log.info(
        "held-out: policy prefers the chosen response %.3f -> %.3f; model at %s",
        before["eval_logp_accuracy"],
        after.get("eval_logp_accuracy", float("nan")),
        trained,
    )

    report = {
        "pipeline": "dpo",
        "config": cfg.model_dump(mode="json"),
        "model_path": trained,
        "base_model": model_path,
        "data": counts,
        "heldout": {"before": before, "after": after},
        "final_metrics": metrics,
        "train_wall_s": train_s,
        "wall_s": time.time() - t0,
    }
    keys = ["loss", "reward_accuracy", "eval_logp_accuracy"]
    finish_run(run_dir, report, "metrics.jsonl", keys, "loss.png", f"DPO ({cfg.dpo.loss})")
    return report


def requests(cfg: DPOConfig) -> Requests:
    from raypost.train.trainer import learner_request

    return {"resources (learner)": learner_request(cfg.resources)}


PIPELINE = Pipeline(
    name="dpo", summary="offline preference optimization: DPO, IPO, SimPO", config=DPOConfig, run=run, requests=requests
)
