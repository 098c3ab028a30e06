"""The pipeline registry: name -> the module that defines it.

Each pipeline is one module of this package with a module-level ``PIPELINE`` (a
:class:`Pipeline`): its config class, ``run(cfg, run_dir) -> report``, what it places on the
cluster, and the hooks Tune needs. The module imports only config at its top, so that the
``raypost`` command parses and validates a config (or prints ``--help``) before any heavy
import. Adding a pipeline: its config, its module, one line in ``MODULES``, its test.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raypost.config.base import ConfigError, StrictModel, build, load_yaml

# name -> module with its PIPELINE (imported on first use)
MODULES: dict[str, str] = {
    "sft": "raypost.pipelines.sft",
    "grpo": "raypost.pipelines.grpo",
    "distill": "raypost.pipelines.distill",
    "reward_model": "raypost.pipelines.reward_model",
    "dpo": "raypost.pipelines.dpo",
    "ppo": "raypost.pipelines.ppo",
}

ALIASES: Mapping[str, str] = {"model": "model.path", "dataset": "data.path", "name": "run.name"}

# Resources by the config section that sets them: {"learner": {"CPU": 2.0}, ...}
Requests = dict[str, dict[str, float]]
# A PBT segment: (the trial's config, the segment's run folder, the Train checkpoint to start
# from or None, the step to stop at) -> an object with ``checkpoint_path``, ``metrics``, ``steps``.
Segment = Callable[[Any, Path, str | None, int], Any]


@dataclass(frozen=True)
class PBTHooks:
    """How a pipeline runs under PBT: in segments of ``run.checkpoint_every`` steps."""

    mutable: tuple[str, ...]  # dotted keys a trial may change when it restarts from another's checkpoint
    segments: Callable[[Any, Path], Segment]  # (trial config, trial folder) -> the segment runner
    check: Callable[[dict[str, Any]], None] = lambda base: None  # the space's base overrides; raises ValueError


@dataclass(frozen=True)
class Pipeline:
    """A registered pipeline. ``cfg`` below is an instance of ``config``."""

    name: str
    summary: str  # one line for ``raypost --help``
    config: type[StrictModel]
    run: Callable[[Any, Path], dict[str, Any]]  # the whole pipeline in an initialized run folder -> report
    requests: Callable[[Any], Requests]  # the peak resources it holds, by config section
    check: Callable[[Any], None] = lambda cfg: None  # placement checks before anything starts (raises)
    aliases: Mapping[str, str] = field(default_factory=lambda: dict(ALIASES))  # --model -> model.path, ...
    # Tune: a trial's body (None: not tunable), work done once for every trial (returns base
    # overrides of the trials' configs), the metric each report carries, PBT support.
    trial: Callable[[Any, Path], None] | None = None
    shared_start: Callable[[Any, Path], dict[str, Any]] | None = None
    check_metric: Callable[[Any, str], None] = lambda cfg, metric: None
    concurrent_trials: bool = True  # False: trials share cluster-wide state and run one at a time
    pbt: PBTHooks | None = None


def names() -> list[str]:
    return sorted(MODULES)


def get(name: str) -> Pipeline:
    """The registered pipeline ``name``; ConfigError naming the known ones otherwise."""
    if name not in MODULES:
        raise ConfigError(f"unknown pipeline '{name}'; known: {', '.join(names())}")
    pipeline = importlib.import_module(MODULES[name]).PIPELINE
    assert pipeline.name == name, f"{MODULES[name]} registers {pipeline.name!r}, not {name!r}"
    return pipeline


def tunable() -> list[str]:
    return [n for n in names() if get(n).trial is not None]


def config_class(name: str) -> type[StrictModel]:
    return get(name).config


def config_for_file(path: str | Path) -> StrictModel:
    """Load an example YAML with the config class its file-name prefix names (``grpo_tiny.yaml``)."""
    stem = Path(path).name
    prefix = max((p for p in MODULES if stem.startswith(p + "_")), key=len, default=None)
    if prefix is None:
        raise ConfigError(f"{stem}: name it '<pipeline>_<what>.yaml' with pipeline in {names()}")
    return build(config_class(prefix), load_yaml(path))
