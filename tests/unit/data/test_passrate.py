"""The pass-rate pass's pure parts, against values worked by hand, and its config's band check."""

from __future__ import annotations

import pytest

from raypost.config import ConfigError, load_config
from raypost.config.grpo import GRPOConfig
from raypost.data import passrate


def test_pass_rate_counts_samples_at_or_above_the_threshold():
    assert passrate.pass_rate([1.0, 0.0, 1.0, 0.5], 1.0) == 0.5  # 2 of 4 reach 1.0
    assert passrate.pass_rate([1.0, 0.0, 1.0, 0.5], 0.5) == 0.75  # 0.5 counts at 0.5
    assert passrate.pass_rate([0.0] * 8, 1.0) == 0.0
    with pytest.raises(ValueError, match="at least one sample"):
        passrate.pass_rate([], 1.0)


def test_the_band_is_strict_at_both_ends():
    assert not passrate.in_band(0.0, 0.0, 1.0)  # nothing solved: dropped
    assert not passrate.in_band(1.0, 0.0, 1.0)  # all solved: dropped
    assert passrate.in_band(0.125, 0.0, 1.0)
    assert not passrate.in_band(0.25, 0.25, 0.75) and passrate.in_band(0.5, 0.25, 0.75)


def test_easy_first_key_orders_by_rate_and_never_crosses_rates():
    k = 8
    ids = [f"p{i}" for i in range(200)]
    for rate in (0.125, 0.5, 0.875):
        keys = [passrate.easy_first_key(i, rate, 0, k) for i in ids]
        # the jitter stays below half the gap to the next rate of 8 samples (1/8)
        assert all(rate <= key < rate + 1 / (2 * k) for key in keys)
    rows = [(i, r) for i in ids[:30] for r in (0.25,)] + [(i, 0.75) for i in ids[30:60]]
    ordered = sorted(rows, key=lambda x: -passrate.easy_first_key(x[0], x[1], 3, k))
    assert [r for _, r in ordered] == [0.75] * 30 + [0.25] * 30
    # the seed reshuffles prompts of one rate
    again = sorted(rows, key=lambda x: -passrate.easy_first_key(x[0], x[1], 4, k))
    assert [i for i, _ in again] != [i for i, _ in ordered]
    assert sorted(again) == sorted(ordered)


def test_summary_counts_by_hand():
    info = passrate.summary([0.0, 0.0, 0.25, 0.5, 1.0], 0.0, 1.0)
    assert info["scored"] == 5 and info["kept"] == 2
    assert info["dropped_unsolved"] == 2 and info["dropped_solved"] == 1
    assert info["mean_pass_rate"] == pytest.approx(1.75 / 5)
    assert info["histogram"] == {"0.00": 2, "0.25": 1, "0.50": 1, "1.00": 1}


def test_an_empty_band_is_refused_naming_both_fields():
    with pytest.raises(ConfigError, match=r"pass_rate.min_pass_rate 0.6 must be below pass_rate.max_pass_rate 0.5"):
        load_config(GRPOConfig, ["--pass_rate.min_pass_rate", "0.6", "--pass_rate.max_pass_rate", "0.5"])
