"""Learner workers run with Ray's jemalloc preloaded (resources.jemalloc), on a real Ray Train
worker group: the library is mapped into the worker, and is not when the option is off."""

from __future__ import annotations

import pytest

from raypost.config.sections import ResourcesConfig, RunConfig


def _allocator_loop(config: dict) -> None:
    import json
    import os

    with open("/proc/self/maps") as fh:
        maps = fh.read()
    from raypost.train.loop import LoopConfig

    with open(LoopConfig.of(config).run_dir + "/allocator.json", "w") as fh:
        json.dump({"jemalloc": "libjemalloc" in maps, "malloc_conf": os.environ.get("MALLOC_CONF", "")}, fh)


def test_jemalloc_env_keeps_what_the_process_already_preloads(monkeypatch):
    from pathlib import Path

    from raypost.utils.alloc import JEMALLOC_CONF, jemalloc_env

    assert jemalloc_env(False) == {}
    monkeypatch.setenv("LD_PRELOAD", "/opt/libother.so")
    monkeypatch.delenv("MALLOC_CONF", raising=False)
    env = jemalloc_env()["env_vars"]
    first, other = env["LD_PRELOAD"].split(" ")
    assert Path(first).is_file() and first.endswith("libjemalloc.so") and other == "/opt/libother.so"
    assert env["MALLOC_CONF"] == JEMALLOC_CONF == "dirty_decay_ms:-1,muzzy_decay_ms:-1"
    decaying = jemalloc_env(decay_ms=5000)["env_vars"]["MALLOC_CONF"]
    assert decaying == "dirty_decay_ms:5000,muzzy_decay_ms:5000"


@pytest.mark.parametrize("on", [True, False])
def test_learner_workers_run_on_jemalloc_unless_turned_off(ray_cluster, tmp_path, on):
    import json

    from raypost.train.trainer import fit

    res = ResourcesConfig(num_workers=1, cpus_per_worker=0.5, jemalloc=on)
    from raypost.train.loop import LoopConfig

    out = tmp_path / "allocator.json"
    loop = LoopConfig(cfg={}, model_path="unused", run_dir=str(tmp_path), total_steps=0)
    result = fit(_allocator_loop, loop, res, RunConfig(storage_path=str(tmp_path), name="alloc"), {})
    assert result.error is None
    seen = json.loads(out.read_text())
    assert seen["jemalloc"] is on
    assert (seen["malloc_conf"] == "dirty_decay_ms:-1,muzzy_decay_ms:-1") is on
