"""DPO: offline preference optimization of a causal LM on Ray Train + DeepSpeed.

What it does, in order:
  1. parse and validate the config (YAML + dotted CLI overrides) before any heavy import;
  2. Ray Data builds or reads preference pairs (prompt, chosen, rejected), puts each prompt
     through the chat template and closes each response with EOS; bad rows become rejects.
     Or, with ``policy_pairs.enabled``, the pairs come from the policy itself (RAFT / online-DPO
     style): the starting policy on a vLLM replica on Serve samples k completions per question,
     the reward app scores them, and each question's best and worst sample (token ids as
     sampled) make its pair; the held-out questions' greedy accuracy is measured there too;
  3. trains the policy against a frozen copy of itself with the registered loss (``dpo.loss``:
     sigmoid DPO, IPO, or the reference-free SimPO; ``dpo.nll_weight`` adds RPO's NLL of the
     chosen response), checkpointing and resuming exactly;
  4. reports the held-out pairs before and after: the share whose chosen response the policy
     prefers, and the implicit reward's accuracy and margin, as TRL logs them; with
     ``policy_pairs``, also the held-out greedy accuracy before and after (on vLLM).

Offline default: the tiny model built from the synthetic task's text, and pairs built from its
rows (chosen = the reference solution; rejected = a wrong final answer or another question's
solution; raypost/data/preference.py). Departures from the paper: the reference log-probs are
computed on the fly by a frozen reference on each worker (not precomputed); IPO uses per-token
log-ratios, as TRL does.

Launch:
  raypost dpo                                                      # offline default
  raypost dpo --config examples/dpo_tiny.yaml --dpo.loss simpo
  raypost dpo --config examples/dpo_policy_pairs_smollm2.yaml      # pairs from the policy's samples
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

    # The policy and the preference pairs (Ray Data; sampled from the policy on Serve with policy_pairs).
    data = dpo_phase.prepare(cfg, run_dir)

    # DPO on Ray Train + DeepSpeed; held-out pairs before the first step and after the last.
    trained, train_s, metrics = dpo_phase.train(cfg, data.model_path, data.train, data.eval, run_dir)
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
        "base_model": data.model_path,
        "data": data.counts,
        "heldout": {"before": before, "after": after},
        "final_metrics": metrics,
        "train_wall_s": train_s,
    }
    if data.accuracy_before is not None:  # policy_pairs: greedy accuracy on held-out questions
        report["heldout_accuracy"] = accuracy_gain(cfg, trained, data)
    report["wall_s"] = time.time() - t0
    keys = ["loss", "reward_accuracy", "eval_logp_accuracy"]
    finish_run(run_dir, report, "metrics.jsonl", keys, "loss.png", f"DPO ({cfg.dpo.loss})")
    return report


def accuracy_gain(cfg: DPOConfig, trained: str, data: Any) -> dict[str, Any]:
    """Held-out greedy accuracy of the trained policy (on vLLM as ``eval`` says), next to the
    starting policy's, measured on the same questions before training."""
    from raypost.eval import heldout_accuracy

    first = data.accuracy_before
    last = heldout_accuracy(trained, data.questions, cfg.eval, cfg.rollout)
    log.info("held-out accuracy: %.3f -> %.3f (%d questions)", first["accuracy"], last["accuracy"], last["n"])
    return {"before": first, "after": last, "gain": last["accuracy"] - first["accuracy"]}


def requests(cfg: DPOConfig) -> Requests:
    """The learner's, or the sampling phase's (policy_pairs) where it holds more: they run in turn."""
    from raypost.train.trainer import learner_request

    learner = {"resources (learner)": learner_request(cfg.resources)}
    if not cfg.policy_pairs.enabled:
        return learner
    from raypost.phases import policy_pairs

    def size(r: Requests) -> tuple[float, float]:
        return sum(p.get("GPU", 0.0) for p in r.values()), sum(p.get("CPU", 0.0) for p in r.values())

    return max(learner, policy_pairs.requests(cfg), key=size)


PIPELINE = Pipeline(
    name="dpo", summary="offline preference optimization: DPO, IPO, SimPO", config=DPOConfig, run=run, requests=requests
)
