"""The learner's memory warning (``raypost.train.grpo_loop.memory_warning``): once its resident
memory has doubled since the first step, and again at each further doubling, with the fix named."""

from __future__ import annotations

from raypost.train.grpo_loop import memory_warning


def test_warns_at_each_doubling_and_names_the_fix():
    assert memory_warning(5.8, 11.5, 0.0, -1) is None  # under 2x the first step
    first = memory_warning(5.8, 11.6, 0.0, -1)
    assert first is not None and "5.8 to 11.6 GB" in first and "--resources.jemalloc_decay_ms 60000" in first
    assert memory_warning(5.8, 15.2, 11.6, -1) is None  # warned at 11.6: quiet until 23.2
    assert memory_warning(5.8, 23.2, 11.6, -1) is not None
    finite = memory_warning(4.0, 8.0, 0.0, 5000)
    assert finite is not None and "resources.jemalloc false" in finite and "60000 (" not in finite


def test_grpo_learners_give_freed_pages_back_after_a_minute_unless_told():
    from raypost.config.base import load_config
    from raypost.config.grpo import GRPOConfig
    from raypost.config.ppo import PPOConfig

    assert load_config(GRPOConfig, []).resources.jemalloc_decay_ms == 60_000
    assert load_config(GRPOConfig, ["--resources.num_workers", "1"]).resources.jemalloc_decay_ms == 60_000
    assert load_config(PPOConfig, []).resources.jemalloc_decay_ms == 5000  # two models: sooner
    assert load_config(GRPOConfig, ["--resources.jemalloc_decay_ms", "-1"]).resources.jemalloc_decay_ms == -1
