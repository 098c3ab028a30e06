"""Build and run (or restore) a Tune sweep from a validated space file."""

from __future__ import annotations

import functools
import logging
import random
from pathlib import Path
from typing import Any

from raypost.config import ConfigError
from raypost.pipelines import registry
from raypost.tune.space import Distribution, SpaceFile, trial_config

log = logging.getLogger("raypost")


def trial_resources(space: SpaceFile) -> dict[str, float]:
    """Resources one running trial holds: its function actor and what its pipeline requests
    (the learner, and for GRPO the Serve replicas). The largest over every value the space can set."""
    requests = registry.get(space.pipeline).requests
    variants = [{}] + [{k: v} for k, d in space.params.items() for v in d.samples()]
    need: dict[str, float] = {"CPU": 0.0}
    for params in variants:
        req = {"CPU": space.cpus_per_trial_driver}
        for part in requests(trial_config(space, params)).values():
            for key, amount in part.items():
                req[key] = req.get(key, 0.0) + amount
        for key, amount in req.items():
            need[key] = max(need.get(key, 0.0), amount)
    return need


def check_metric_cadence(space: SpaceFile) -> None:
    """Every report (one per checkpoint) must carry the metric; the pipeline's check says how."""
    registry.get(space.pipeline).check_metric(trial_config(space, {}), space.metric)


def check_sweep(space: SpaceFile) -> None:
    """Fail before anything starts if the metric is not reported at every checkpoint, or if
    max_concurrent_trials trials cannot run at once."""
    from raypost.utils.cluster import check_resources

    check_metric_cadence(space)
    if not registry.get(space.pipeline).concurrent_trials and space.max_concurrent_trials > 1:
        raise ConfigError(
            f"{space.pipeline} sweeps run one trial at a time (each trial owns cluster-wide state "
            f"such as its Serve apps); set max_concurrent_trials: 1"
        )
    per_trial = trial_resources(space)
    check_resources({f"trial {i + 1} of max_concurrent_trials": per_trial for i in range(space.max_concurrent_trials)})


def pbt_mutation(dist: Distribution) -> Any:
    """What PBT's explore does with a param: ranges resample from the distribution or scale the
    value by 0.8/1.2; numeric grid/choice values resample from the list or scale too (a list
    would only step to a neighbouring value); other lists step to a neighbour."""
    values = dist.grid or dist.choice
    if values is None:
        return dist.to_tune()
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return functools.partial(random.choice, list(values))
    return list(values)


def scheduler(space: SpaceFile) -> Any:
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, HyperBandScheduler, PopulationBasedTraining

    s = space.scheduler
    if s.type == "pbt":
        return PopulationBasedTraining(
            time_attr="training_iteration",
            perturbation_interval=s.perturbation_interval,
            hyperparam_mutations={k: pbt_mutation(d) for k, d in space.params.items()},
            quantile_fraction=s.quantile_fraction,
            resample_probability=s.resample_probability,
            synch=s.synch,
        )
    if s.type == "asha":
        return ASHAScheduler(
            time_attr="training_iteration",
            max_t=s.max_t,
            grace_period=s.grace_period,
            reduction_factor=s.reduction_factor,
        )
    if s.type == "hyperband":
        return HyperBandScheduler(time_attr="training_iteration", max_t=s.max_t, reduction_factor=s.reduction_factor)
    return FIFOScheduler()


def search_alg(space: SpaceFile) -> Any:
    """Tune's basic variant generator for random/grid (it takes the concurrency limit itself:
    Tune wraps only Searchers in a ConcurrencyLimiter), else the optional searcher."""
    from ray.tune.search import BasicVariantGenerator

    kind = space.search.type
    if kind == "grid":
        loose = [k for k, d in space.params.items() if d.kind not in ("grid", "choice")]
        if loose:
            raise ConfigError(f"search: grid needs grid or choice for every param; {', '.join(loose)} are not")
    if kind in ("grid", "random"):
        return BasicVariantGenerator(random_state=space.search.seed, max_concurrent=space.max_concurrent_trials)
    try:
        if kind == "optuna":
            from ray.tune.search.optuna import OptunaSearch

            return OptunaSearch(seed=space.search.seed)
        from ray.tune.search.hyperopt import HyperOptSearch

        return HyperOptSearch(random_state_seed=space.search.seed)
    except (ImportError, AssertionError) as err:
        raise ConfigError(f"search: {kind} is not installed ({err}); pip install {kind} or use random/grid") from None


def param_space(space: SpaceFile) -> dict[str, Any]:
    grid = space.search.type == "grid"
    return {
        key: (
            dist.model_copy(update={"choice": None, "grid": dist.choice}).to_tune()
            if grid and dist.kind == "choice"
            else dist.to_tune()
        )
        for key, dist in space.params.items()
    }


def run_sweep(space: SpaceFile, sweep_dir: Path) -> Any:
    """Tuner.fit(); if ``sweep_dir`` holds an interrupted sweep, restore it (finished trials
    are not rerun; unfinished ones resume from their own Train checkpoints)."""
    from ray import tune

    from raypost.tune.trials import run_trial

    trainable = tune.with_resources(
        tune.with_parameters(run_trial, space=space.model_dump(mode="json"), sweep_dir=str(sweep_dir)),
        {"CPU": space.cpus_per_trial_driver},
    )
    if tune.Tuner.can_restore(str(sweep_dir)):
        log.info("restoring the sweep in %s", sweep_dir)
        tuner = tune.Tuner.restore(str(sweep_dir), trainable=trainable, resume_errored=True)
    else:
        tuner = tune.Tuner(
            trainable,
            param_space=param_space(space),
            tune_config=tune.TuneConfig(
                metric=space.metric,
                mode=space.mode,
                scheduler=scheduler(space),
                search_alg=search_alg(space),
                num_samples=space.num_samples,
                max_concurrent_trials=space.max_concurrent_trials,
            ),
            run_config=tune.RunConfig(name=sweep_dir.name, storage_path=str(sweep_dir.parent), verbose=1),
        )
    return tuner.fit()
