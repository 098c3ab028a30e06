"""GRPO end to end in one Ray job: SFT warm-up, then GRPO with vLLM rollouts on Ray Serve.

What it does, in order:
  1. parse and validate the config (YAML + dotted CLI overrides) before any heavy import;
  2. Ray Data preprocesses prompts (chat template, tokenization, rejects);
  3. builds the offline tiny model (or loads --model) and warms it up with the SFT learner;
  4. deploys two Serve apps named after the run: "<run>-rollout" (vLLM replicas) and
     "<run>-reward" (verifiers + reward model), and measures held-out greedy accuracy, while the
     GRPO learner starts on Ray Train + DeepSpeed (it waits for both before its first step);
  5. trains GRPO, measures held-out accuracy again;
  6. removes its Serve apps and pushed weights; writes report.json and reward.png.

The embedded default's SFT demos are noisy on purpose: half are a weak teacher's guess
(``#### <first number>``), so the warm-up learns to guess as well as to work the problem, and
GRPO's accuracy reward selects the worked solutions (docs/guide.md, "The embedded default";
benchmarks/RESULTS.md has its held-out gains and wall time on 2 cores).

Departures from the GRPO paper (DeepSeekMath): one policy update per batch (mu = 1); the
samples' vLLM behaviour log-probs enter through an off-policy correction (truncated importance
sampling by default, ``--async_rl.correction``), which in sync mode is a weight of 1 up to
numerics; KL to the reference is off by default (beta = 0, as in DAPO and Dr.GRPO); the
advantage, loss aggregation (grpo / dapo / dr_grpo), dynamic sampling and overlong handling
are config choices (``--algo.loss dapo --algo.eps_high 0.28 --algo.dynamic_sampling true``).
``--async_rl.eta 1`` makes it async: rollouts of the next batches overlap training, and no
trained sample is more than eta weight versions old (docs/async.md).

Launch:
  raypost grpo                                         # offline embedded default
  raypost grpo --config examples/grpo_tiny.yaml --algo.beta 0.01
  raypost grpo --config examples/grpo_async.yaml                     # async, eta 1
  raypost grpo --model Qwen/Qwen2.5-0.5B-Instruct --dataset ../shared/data/gsm8k/train.jsonl
  ray job submit --working-dir . -- $PWD/.venv/bin/raypost grpo --run.name my-grpo   (README: "Submitting as a Ray job")
Re-submitting the same command (same run.name and run.storage_path) resumes from the latest checkpoint.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raypost.config.grpo import GRPOConfig
from raypost.pipelines.registry import Pipeline, Requests

log = logging.getLogger("raypost")


def _grpo_loop() -> Callable[[dict], None]:
    from raypost.train.grpo_loop import grpo_loop

    return grpo_loop


@dataclass(frozen=True)
class RLJob:
    """What an RL pipeline on this job's skeleton names: its learner (imported when it runs)."""

    name: str  # the report's pipeline, the Ray Train run's name
    title: str  # in the log lines and the plot
    loop: Callable[[], Callable[[dict], None]]  # -> the Ray Train loop function


GRPO = RLJob("grpo", "GRPO", _grpo_loop)


def run(cfg: GRPOConfig, run_dir: Path) -> dict[str, Any]:
    """The main job: warm-up, held-out accuracy, GRPO, held-out accuracy, report."""
    return run_job(cfg, run_dir, heldout=True)


def trial(cfg: GRPOConfig, run_dir: Path) -> None:
    """A Tune trial: GRPO from the sweep's shared warm-up model, without the held-out passes
    (the sweep's metric comes from the learner's reports)."""
    check(cfg)
    run_job(cfg, run_dir, heldout=False)


def run_job(cfg: GRPOConfig, run_dir: Path, heldout: bool, job: RLJob = GRPO) -> dict[str, Any]:
    """An RL job on Serve rollouts (GRPO, or PPO through ``job``): warm-up, held-out accuracy
    (``heldout``), the learner, held-out accuracy, the report."""
    from raypost.phases import data as data_phase
    from raypost.phases import grpo as grpo_phase
    from raypost.utils.report import finish_run

    t0 = time.time()
    serve_started = grpo_phase.start_serve(cfg)  # Serve's controller and proxy start meanwhile
    # Data and base model.
    model_path, data = data_phase.prepare(cfg.data, cfg.model, run_dir)

    # SFT warm-up (the SFT learner), then the Serve apps on the warmed-up model.
    sft_model, warmup_s = grpo_phase.warmup(cfg, model_path, data, run_dir)
    none = {"accuracy": None, "n": 0, "samples": []}

    def before_rl() -> dict[str, Any]:
        if not heldout:
            return none
        out = grpo_phase.evaluate(cfg, data, model_path=sft_model)
        log.info("held-out accuracy before %s: %.3f", job.title, out["accuracy"])
        return out

    # The apps deploy and the held-out pass runs on a thread while the learner starts (its ranks
    # wait for both before the first step); removed with the pushed weights when the run ends or fails.
    with grpo_phase.served(cfg, sft_model, first=before_rl, started=serve_started) as startup:
        # The RL learner on Ray Train + DeepSpeed, rollouts on Serve.
        final_model, grpo_s, metrics = grpo_phase.train(cfg, sft_model, data, run_dir, job.loop(), job.name, startup)
        before = after = startup.first.result()
        if heldout:
            after = grpo_phase.evaluate(cfg, data, version=cfg.algo.steps, model_path=sft_model)
            log.info("held-out accuracy after %s: %.3f (was %.3f)", job.title, after["accuracy"], before["accuracy"])

    report = {
        "pipeline": job.name,
        "config": cfg.model_dump(mode="json"),
        "model_path": final_model,
        "data": data.counts,
        "heldout_accuracy_before": before["accuracy"],
        "heldout_accuracy_after": after["accuracy"],
        "heldout_gain": after["accuracy"] - before["accuracy"] if heldout else None,
        "heldout_n": after["n"],
        "heldout_before": {k: v for k, v in before.items() if k != "samples"},
        "heldout_after": {k: v for k, v in after.items() if k != "samples"},
        "samples_before": before["samples"],
        "samples_after": after["samples"],
        "final_metrics": metrics,
        "phase_s": {"warmup": warmup_s, job.name: grpo_s},
        "wall_s": time.time() - t0,
    }
    finish_run(
        run_dir,
        report,
        "metrics.jsonl",
        ["reward_mean", "accuracy", "response_len", "loss", "step_s"],
        "reward.png",
        job.title,
    )
    return report


def requests(cfg: GRPOConfig) -> Requests:
    from raypost.phases.grpo import placement_requests

    return placement_requests(cfg)


def check(cfg: GRPOConfig) -> None:
    from raypost.phases.grpo import check_placement

    check_placement(cfg)


def shared_start(cfg: GRPOConfig, sweep_dir: Path) -> dict[str, Any]:
    """A sweep's SFT warm-up, run once: every trial starts GRPO from it with warm-up off."""
    if not cfg.warmup.enabled:
        return {}
    from raypost.phases import data as data_phase
    from raypost.phases import grpo as grpo_phase

    run_dir = sweep_dir / "warmup"
    run_dir.mkdir(parents=True, exist_ok=True)
    model_path, data = data_phase.prepare(cfg.data, cfg.model, run_dir)
    warm, _ = grpo_phase.warmup(cfg, model_path, data, run_dir)
    return {"model": {"path": warm}, "warmup": {"enabled": False}}


PIPELINE = Pipeline(
    name="grpo",
    summary="the main job: SFT warm-up, then GRPO with vLLM rollouts and rewards on Ray Serve",
    config=GRPOConfig,
    run=run,
    requests=requests,
    check=check,
    trial=trial,
    shared_start=shared_start,
    concurrent_trials=False,  # a trial owns the job's Serve apps
)
