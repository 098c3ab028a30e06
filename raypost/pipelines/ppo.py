"""PPO with a learned critic, in the GRPO job: SFT warm-up, then PPO with vLLM rollouts on Serve.

What it does: everything ``raypost grpo`` does (raypost/pipelines/grpo.py: data, warm-up, the
Serve apps, held-out accuracy before and after, the report), with the GRPO learner replaced by
PPO's: each Ray Train worker holds the policy and a critic (a value model with its own DeepSpeed
engine and optimizer, ``critic.*``), advantages are GAE over the tokens from the critic's values
and the sequence reward on the last token, and the critic learns the returns with PPO2's
clipped value loss. Rollouts, rewards, async mode and the staleness bound are GRPO's.

Departures from PPO as in InstructGPT / OpenRLHF: one policy update per batch (the critic may take
several, ``critic.epochs``); the KL to the reference is a loss term (``algo.beta``, off by
default) rather than a per-token reward penalty; the critic starts from the policy's weights
with a zero value head (``critic.model_path`` may name a reward model instead); ``algo.group_size``
samples per prompt only shape the batch (``algo.advantage`` is unused).

Launch:
  raypost ppo                                          # offline embedded default
  raypost ppo --config examples/ppo_smollm2.yaml --run.seed 1
  ray job submit --working-dir . -- $PWD/.venv/bin/python pipelines/ppo.py --run.name my-ppo
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from raypost.config.ppo import PPOConfig
from raypost.pipelines import grpo
from raypost.pipelines.registry import Pipeline


def _ppo_loop() -> Callable[[dict], None]:
    from raypost.train.ppo_loop import ppo_loop

    return ppo_loop


PPO = grpo.RLJob("ppo", "PPO", _ppo_loop)


def run(cfg: PPOConfig, run_dir: Path) -> dict[str, Any]:
    """Warm-up, held-out accuracy, PPO, held-out accuracy, report."""
    return grpo.run_job(cfg, run_dir, heldout=True, job=PPO)


def trial(cfg: PPOConfig, run_dir: Path) -> None:
    """A Tune trial: PPO from the sweep's shared warm-up model, without the held-out passes."""
    grpo.check(cfg)
    grpo.run_job(cfg, run_dir, heldout=False, job=PPO)


PIPELINE = Pipeline(
    name="ppo",
    summary="PPO with a learned critic and GAE: the GRPO job's rollouts, rewards and async mode",
    config=PPOConfig,
    run=run,
    requests=grpo.requests,
    check=grpo.check,
    trial=trial,
    shared_start=grpo.shared_start,
    concurrent_trials=False,  # a trial owns the job's Serve apps
)
