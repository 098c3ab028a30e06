"""The tune_spaces DSL: every shipped space loads, and bad keys or distributions are errors
that name them. Pure (no Ray)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from raypost.config import ConfigError
from raypost.tune.space import Distribution, load_space, trial_config
from tests.conftest import ROOT

SPACES = sorted((ROOT / "tune_spaces").glob("*.yaml"))


@pytest.mark.parametrize("path", SPACES, ids=lambda p: p.name)
def test_every_shipped_space_loads(path: Path):
    space = load_space(path)
    for key, dist in space.params.items():
        for value in dist.samples():
            cfg = trial_config(space, {key: value})
            section, field = key.rsplit(".", 1)
            node = cfg
            for part in section.split("."):
                node = getattr(node, part)
            assert getattr(node, field) == value


def test_spaces_cover_every_sweepable_pipeline():
    from raypost.pipelines import tunable

    assert {load_space(p).pipeline for p in SPACES} == set(tunable())


def _write(tmp_path: Path, params: dict, **extra) -> Path:
    doc = {"pipeline": "sft", "metric": "eval_loss", "mode": "min", "params": params, **extra}
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_unknown_key_names_the_nearest_key(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown config key 'optim.lrr': did you mean 'optim.lr'"):
        load_space(_write(tmp_path, {"optim.lrr": {"uniform": [0.1, 0.2]}}))


def test_section_is_not_a_searchable_value(tmp_path):
    with pytest.raises(ConfigError, match=r"'optim' is a section; name one of its keys"):
        load_space(_write(tmp_path, {"optim": {"choice": [1, 2]}}))


@pytest.mark.parametrize(
    "dist, message",
    [
        ({"loguniform": [0.0, 1.0]}, "loguniform needs lo > 0"),
        ({"uniform": [2.0, 1.0]}, r"uniform needs lo < hi"),
        ({"uniform": [0.1, 0.2], "choice": [1]}, "give exactly one of"),
        ({"normal": [0, 1]}, r"params.optim.lr: unknown distribution 'normal'; use one of loguniform"),
        (0.001, r"params.optim.lr: a distribution is a mapping such as \{uniform: \[lo, hi\]\}"),
    ],
)
def test_bad_distribution_is_named(tmp_path, dist, message):
    with pytest.raises(ConfigError, match=message):
        load_space(_write(tmp_path, {"optim.lr": dist}))


def test_value_the_pipeline_rejects_names_param_and_bound(tmp_path):
    with pytest.raises(ConfigError, match=r"params.resources.num_workers = 0 is rejected by the sft config"):
        load_space(_write(tmp_path, {"resources.num_workers": {"choice": [0, 1]}}))


def test_base_overrides_and_params_reach_the_trial_config(tmp_path):
    space = load_space(
        _write(
            tmp_path,
            {"optim.lr": {"grid": [0.001, 0.002]}},
            base={"train": {"max_steps": 7}, "optim": {"lr": 0.5, "micro_batch_size": 2}},
        )
    )
    cfg = trial_config(space, {"optim.lr": 0.002})
    assert (cfg.optim.lr, cfg.optim.micro_batch_size, cfg.train.max_steps) == (0.002, 2, 7)


def test_distributions_map_to_tune_domains():
    from ray import tune

    assert Distribution(grid=[1, 2]).to_tune() == tune.grid_search([1, 2])
    lo, hi = 1e-4, 1e-2
    dom = Distribution(loguniform=(lo, hi)).to_tune()
    draws = [dom.sample() for _ in range(200)]
    assert all(lo <= d <= hi for d in draws)
    assert sum(d < 1e-3 for d in draws) > 60  # log scale: half the draws fall in the lower decade
    assert {Distribution(randint=(3, 5)).to_tune().sample() for _ in range(50)} == {3, 4}
    q = Distribution(qloguniform=(1e-3, 1e-1, 1e-3)).to_tune().sample()
    assert abs(q / 1e-3 - round(q / 1e-3)) < 1e-6


def test_grid_search_needs_discrete_params(tmp_path):
    from raypost.tune.sweep import search_alg

    space = load_space(_write(tmp_path, {"optim.lr": {"uniform": [0.1, 0.2]}}, search={"type": "grid"}))
    with pytest.raises(ConfigError, match="grid needs grid or choice for every param; optim.lr"):
        search_alg(space)


def test_unknown_pipeline_is_named(tmp_path):
    path = _write(tmp_path, {"optim.lr": {"uniform": [0.1, 0.2]}}, pipeline="trpo")
    with pytest.raises(ConfigError, match="pipeline"):
        load_space(path)


def test_random_and_grid_search_carry_the_concurrency_limit(tmp_path):
    # Tune wraps only Searchers in a ConcurrencyLimiter; the basic variant generator must get
    # max_concurrent itself, or every sampled trial starts at once.
    from raypost.tune.sweep import search_alg

    for kind in ("random", "grid"):
        space = load_space(
            _write(tmp_path, {"optim.lr": {"choice": [0.1, 0.2]}}, search={"type": kind}, max_concurrent_trials=3)
        )
        assert search_alg(space).max_concurrent == 3


def test_eval_loss_needs_an_eval_at_every_checkpoint(tmp_path):
    from raypost.tune.sweep import check_metric_cadence

    params = {"optim.lr": {"choice": [0.1, 0.2]}}
    ok = load_space(_write(tmp_path, params, base={"train": {"eval_every": 5}, "run": {"checkpoint_every": 10}}))
    check_metric_cadence(ok)
    bad = load_space(_write(tmp_path, params, base={"train": {"eval_every": 4}, "run": {"checkpoint_every": 10}}))
    with pytest.raises(
        ConfigError,
        match=r"base.run.checkpoint_every \(10\) must be a multiple of "
        r"base.train.eval_every \(4\)",
    ):
        check_metric_cadence(bad)
    off = load_space(
        _write(tmp_path, params, base={"train": {"eval_every": 5, "eval_loss": False}, "run": {"checkpoint_every": 10}})
    )
    with pytest.raises(ConfigError, match=r"set base.train.eval_loss to true"):
        check_metric_cadence(off)


@pytest.mark.parametrize("path", SPACES, ids=lambda p: p.name)
def test_shipped_spaces_report_their_metric_at_every_checkpoint(path: Path):
    from raypost.tune.sweep import check_metric_cadence

    check_metric_cadence(load_space(path))


def test_trial_resources_add_the_learner_serve_replicas_and_trial_actor():
    from raypost.tune.sweep import trial_resources

    # grpo_quick: learner 2 workers x 0.5 CPU, one rollout replica 0.5, one reward replica 0.25,
    # the trial's own actor 0.1
    assert trial_resources(load_space(ROOT / "tune_spaces" / "grpo_quick.yaml"))["CPU"] == pytest.approx(1.85)
    # sft_quick: 1 worker x 0.5 CPU + 0.1
    assert trial_resources(load_space(ROOT / "tune_spaces" / "sft_quick.yaml"))["CPU"] == pytest.approx(0.6)
    # distill_quick: the learner (1 x 0.5) and the teacher pass (0.5) take turns, + 0.1
    assert trial_resources(load_space(ROOT / "tune_spaces" / "distill_quick.yaml"))["CPU"] == pytest.approx(0.6)


def test_pbt_searches_only_what_a_restart_can_change(tmp_path):
    pbt = {"scheduler": {"type": "pbt"}}
    with pytest.raises(ConfigError, match=r"pbt can only change optim.lr, optim.weight_decay.*micro_batch_size"):
        load_space(
            _write(
                tmp_path, {"optim.lr": {"uniform": [1e-4, 1e-3]}, "optim.micro_batch_size": {"choice": [4, 8]}}, **pbt
            )
        )
    with pytest.raises(
        ConfigError, match=r"pbt runs pipelines whose trials resume .*\(distill, sft\).*hyperband for grpo"
    ):
        load_space(
            _write(
                tmp_path,
                {"optim.lr": {"uniform": [1e-4, 1e-3]}},
                **{**pbt, "pipeline": "grpo", "metric": "reward_mean"},
            )
        )


def test_pbt_distills_offline_kd_and_may_perturb_its_kd_parameters(tmp_path):
    pbt = {"scheduler": {"type": "pbt"}, "pipeline": "distill"}
    kd = {
        "distill.beta": {"uniform": [0.1, 0.9]},
        "distill.kd_weight": {"uniform": [0.3, 1.0]},
        "optim.lr": {"loguniform": [1e-4, 1e-2]},
    }
    assert set(load_space(_write(tmp_path, kd, **pbt)).params) == set(kd)
    with pytest.raises(ConfigError, match="pbt distills in mode offline_kd only.*on_policy"):
        load_space(_write(tmp_path, kd, base={"distill": {"mode": "on_policy"}}, **pbt))
    with pytest.raises(ConfigError, match=r"pbt can only change .*distill.kd_weight.*move distill.top_k to base"):
        load_space(_write(tmp_path, {**kd, "distill.top_k": {"choice": [8, 16]}}, **pbt))


def test_pbt_mutations_are_the_space_params(tmp_path):
    from ray.tune.schedulers import PopulationBasedTraining

    from raypost.tune.sweep import scheduler

    space = load_space(
        _write(
            tmp_path,
            {"optim.lr": {"loguniform": [1e-4, 1e-2]}},
            scheduler={"type": "pbt", "perturbation_interval": 3, "quantile_fraction": 0.5},
        )
    )
    pbt = scheduler(space)
    assert isinstance(pbt, PopulationBasedTraining)
    assert set(pbt._hyperparam_mutations) == {"optim.lr"}
    assert (pbt._perturbation_interval, pbt._quantile_fraction) == (3, 0.5)


def test_pbt_scales_numeric_grid_values_and_steps_through_others():
    from raypost.tune.sweep import pbt_mutation

    numeric = pbt_mutation(Distribution(grid=[3e-3, 1e-6]))
    assert callable(numeric) and {numeric() for _ in range(50)} == {3e-3, 1e-6}  # scaled by Tune, or resampled
    assert pbt_mutation(Distribution(choice=["cosine", "linear"])) == ["cosine", "linear"]
