"""Hyperparameter sweep of a pipeline with Ray Tune; each trial is that pipeline's Ray Train run.

What it does, in order:
  1. reads the space file (tune_spaces/*.yaml) and checks every key and bound against the
     pipeline's typed config, before any heavy import;
  2. checks that max_concurrent_trials trials fit on the cluster;
  3. GRPO: runs the SFT warm-up once, and every trial starts GRPO from that model;
     distill: trains the teacher once, and every trial distills that teacher;
  4. runs the sweep (ASHA, HyperBand, PBT or FIFO; random, grid, or Optuna/HyperOpt if
     installed). Ray Train V2 runs inside a function trainable and forwards each checkpointed
     report to Tune (TuneReportCallback), so ASHA stops trials on the pipeline's own metric.
     PBT trials (SFT, offline-KD distillation) run in segments instead, one Train run and one Tune checkpoint each,
     so PBT's exploit can restart a trial from another's checkpoint;
  5. writes <sweep>/results.json (the table), best_config.yaml (a ready-to-run pipeline
     config), best_model/ (HF export of the best finished trial) and metric.png.

Departures from a plain Tune script: trials are named by trial id under <sweep>/trials, and
re-running the same command after the driver died restores the sweep (Tuner.restore):
finished trials are kept, unfinished ones resume from their own Train checkpoints.

Launch:
  raypost tune --pipeline sft --space tune_spaces/sft_quick.yaml
  raypost tune --pipeline sft --space tune_spaces/sft_pbt.yaml
  raypost tune --pipeline distill --space tune_spaces/distill_pbt.yaml
  raypost tune --pipeline grpo --space tune_spaces/grpo_quick.yaml --name my-sweep
  ray job submit --working-dir . -- $PWD/.venv/bin/raypost tune --pipeline sft --space tune_spaces/sft.yaml
"""

from __future__ import annotations

import argparse
from pathlib import Path

from raypost.config import ConfigError
from raypost.pipelines import registry
from raypost.tune.space import load_space


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="raypost tune", description=__doc__.splitlines()[0])
    p.add_argument("--pipeline", required=True, choices=registry.tunable(), help="Pipeline every trial runs.")
    p.add_argument("--space", required=True, help="Search space YAML (tune_spaces/*.yaml).")
    p.add_argument("--name", default=None, help="Sweep name (default: tune-<space file stem>); the resume key.")
    p.add_argument("--storage", default="runs", help="Folder that holds the sweep folder.")
    return p.parse_args(argv)


def main(argv: list[str]) -> dict:
    args = parse(argv)
    space = load_space(args.space)
    if space.pipeline != args.pipeline:
        raise ConfigError(f"{args.space} is a {space.pipeline} space; run it with --pipeline {space.pipeline}")

    import logging

    from raypost.phases.data import check_data_inputs
    from raypost.tune import outputs, sweep, trials
    from raypost.tune.space import trial_config
    from raypost.utils.cluster import init_ray
    from raypost.utils.logs import setup_logging

    setup_logging()
    log = logging.getLogger("raypost")
    check_data_inputs(trial_config(space, {}))  # files and datasets, before Ray starts
    init_ray()
    sweep_dir = (Path(args.storage) / (args.name or f"tune-{Path(args.space).stem}")).resolve()
    sweep_dir.mkdir(parents=True, exist_ok=True)
    sweep.check_sweep(space)

    # Done once for every trial: GRPO's SFT warm-up, distillation's teacher.
    space = trials.shared_start(space, sweep_dir)

    # The sweep itself; restored if this folder holds an interrupted one.
    results = sweep.run_sweep(space, sweep_dir)

    out = outputs.write_outputs(results, space, sweep_dir)
    print(out["table"])
    log.info(
        "best trial %s: %s = %.6g; config %s; model %s; plot %s",
        out["best_trial"],
        space.metric,
        out["best_metric"],
        out["best_config"],
        out["best_model"],
        out["plot"],
    )
    return out
