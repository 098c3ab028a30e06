"""The search-space DSL of ``tune_spaces/*.yaml``: typed, validated once against the pipeline's config.

A space file names the pipeline, the metric, the scheduler and search, and maps dotted config
keys of that pipeline to distributions::

    pipeline: sft
    metric: eval_loss
    mode: min
    num_samples: 6
    scheduler: {type: asha, max_t: 6, grace_period: 1, reduction_factor: 2}
    base: {train: {max_steps: 60}}          # fixed overrides for every trial
    params:
      optim.lr: {loguniform: [1.0e-4, 3.0e-3]}
      optim.micro_batch_size: {choice: [4, 8]}

An unknown key, a key that is a section rather than a value, or a value the pipeline's
config rejects is a :class:`ConfigError` naming the key.
"""

from __future__ import annotations

import difflib
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from raypost.config.base import ConfigError, StrictModel, build, deep_merge, load_yaml, section_model, set_dotted
from raypost.pipelines import registry

DISTRIBUTIONS = ("loguniform", "uniform", "choice", "grid", "randint", "qloguniform")


class Distribution(StrictModel):
    """Exactly one of: loguniform [lo, hi], uniform [lo, hi], choice [..], grid [..],
    randint [lo, hi) or qloguniform [lo, hi, q]."""

    loguniform: tuple[float, float] | None = Field(None, description="Log-uniform on [lo, hi], lo > 0.")
    uniform: tuple[float, float] | None = Field(None, description="Uniform on [lo, hi].")
    choice: list[Any] | None = Field(None, min_length=1, description="One of these values, at random.")
    grid: list[Any] | None = Field(None, min_length=1, description="Every one of these values (grid search).")
    randint: tuple[int, int] | None = Field(None, description="An integer in [lo, hi).")
    qloguniform: tuple[float, float, float] | None = Field(None, description="Log-uniform rounded to q.")

    @model_validator(mode="before")
    @classmethod
    def _known_kind(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise ValueError(f"a distribution is a mapping such as {{uniform: [lo, hi]}}, got {data!r}")
        unknown = [k for k in data if k not in DISTRIBUTIONS]
        if unknown:
            raise ValueError(f"unknown distribution {unknown[0]!r}; use one of {', '.join(DISTRIBUTIONS)}")
        return data

    @model_validator(mode="after")
    def _one_kind(self) -> Distribution:
        set_ = [k for k in DISTRIBUTIONS if getattr(self, k) is not None]
        if len(set_) != 1:
            raise ValueError(f"give exactly one of {', '.join(DISTRIBUTIONS)}; got {set_ or 'none'}")
        bounds = self.loguniform or self.uniform or self.randint or self.qloguniform
        if bounds is not None and not bounds[0] < bounds[1]:
            raise ValueError(f"{set_[0]} needs lo < hi, got {list(bounds)}")
        if (self.loguniform or self.qloguniform) and (self.loguniform or self.qloguniform)[0] <= 0:
            raise ValueError(f"{set_[0]} needs lo > 0")
        if self.qloguniform and self.qloguniform[2] <= 0:
            raise ValueError("qloguniform needs q > 0")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in DISTRIBUTIONS if getattr(self, k) is not None)

    def samples(self) -> list[Any]:
        """Values that stand for the whole range when the pipeline config checks it."""
        v = getattr(self, self.kind)
        if self.kind in ("choice", "grid"):
            return list(v)
        if self.kind == "randint":
            return [v[0], v[1] - 1]
        if self.kind == "qloguniform":
            return [max(v[2], round(v[0] / v[2]) * v[2]), round(v[1] / v[2]) * v[2]]
        return [v[0], v[1]]

    def to_tune(self) -> Any:
        from ray import tune

        v = getattr(self, self.kind)
        return {
            "loguniform": lambda: tune.loguniform(*v),
            "uniform": lambda: tune.uniform(*v),
            "choice": lambda: tune.choice(v),
            "grid": lambda: tune.grid_search(v),
            "randint": lambda: tune.randint(*v),
            "qloguniform": lambda: tune.qloguniform(*v),
        }[self.kind]()


class SchedulerSpec(StrictModel):
    """Trial scheduler. ``max_t``/``grace_period`` count reports (training_iteration)."""

    type: Literal["fifo", "asha", "hyperband", "pbt"] = Field("asha", description="Scheduler.")
    max_t: int = Field(10, ge=1, le=1_000_000, description="Max reports per trial (asha, hyperband).")
    grace_period: int = Field(1, ge=1, le=1_000_000, description="Reports before ASHA may stop a trial.")
    reduction_factor: float = Field(2.0, ge=1.1, le=100.0, description="ASHA/HyperBand halving rate.")
    perturbation_interval: int = Field(2, ge=1, le=1_000_000, description="PBT: reports between exploit/explore.")
    quantile_fraction: float = Field(0.25, gt=0.0, le=0.5, description="PBT: bottom fraction that copies the top.")
    resample_probability: float = Field(
        0.25, ge=0.0, le=1.0, description="PBT: chance to resample instead of perturbing a value by 0.8x/1.2x."
    )
    synch: bool = Field(
        False,
        description="PBT: synchronous, as in the paper: a trial that reaches a perturbation "
        "point waits (paused, from its checkpoint) until every trial has, so "
        "trials that run at different speeds still compare at equal steps.",
    )


class SearchSpec(StrictModel):
    """Search algorithm. random/grid always; optuna or hyperopt if the package is installed."""

    type: Literal["random", "grid", "optuna", "hyperopt"] = Field("random", description="Search algorithm.")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Seed of the search algorithm.")


class SpaceFile(StrictModel):
    """One ``tune_spaces/*.yaml`` file."""

    pipeline: str = Field(..., description="Registered pipeline (``raypost --help``) whose config the params override.")
    metric: str = Field(..., min_length=1, description="Reported metric to optimize (e.g. eval_loss, reward_mean).")
    mode: Literal["min", "max"] = Field(..., description="Minimize or maximize the metric.")
    num_samples: int = Field(4, ge=1, le=100_000, description="Trials (grid: repeats of the whole grid).")
    max_concurrent_trials: int = Field(1, ge=1, le=10_000, description="Trials at once; checked vs the cluster.")
    cpus_per_trial_driver: float = Field(0.1, gt=0.0, le=64.0, description="CPU of each trial's function actor.")
    scheduler: SchedulerSpec = Field(default_factory=SchedulerSpec, description="Trial scheduler.")
    search: SearchSpec = Field(default_factory=SearchSpec, description="Search algorithm.")
    base: dict[str, Any] = Field(default_factory=dict, description="Pipeline overrides shared by every trial.")
    params: dict[str, Distribution] = Field(..., min_length=1, description="Dotted config key -> distribution.")

    @model_validator(mode="after")
    def _tunable_pipeline(self) -> SpaceFile:
        if self.pipeline not in registry.tunable():
            raise ValueError(f"pipeline '{self.pipeline}' has no Tune trial; tunable: {', '.join(registry.tunable())}")
        return self

    @model_validator(mode="after")
    def _pbt_mutates_what_resume_can_change(self) -> SpaceFile:
        if self.scheduler.type != "pbt":
            return self
        pbt = registry.get(self.pipeline).pbt
        if pbt is None:
            raise ValueError(
                f"scheduler pbt runs pipelines whose trials resume each other's learner checkpoints "
                f"({', '.join(n for n in registry.tunable() if registry.get(n).pbt)}); use asha or "
                f"hyperband for {self.pipeline}"
            )
        pbt.check(self.base)
        fixed = [k for k in self.params if k not in pbt.mutable]
        if fixed:
            raise ValueError(
                f"scheduler pbt can only change {', '.join(pbt.mutable)} when a trial restarts from "
                f"another's checkpoint; move {', '.join(fixed)} to base"
            )
        if self.search.type not in ("random", "grid"):
            raise ValueError("scheduler pbt draws its first configs itself; use search: random")
        return self


def leaf_field(model: type[StrictModel], dotted: str) -> None:
    """Raise ConfigError unless ``dotted`` names a value (not a section) of ``model``."""
    node: type[StrictModel] | None = model
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        fields = node.model_fields
        if part not in fields:
            close = difflib.get_close_matches(part, sorted(fields), n=1, cutoff=0.5)
            where = ".".join(parts[:i] + [part])
            hint = (
                f"did you mean '{'.'.join(parts[:i] + [close[0]])}'?"
                if close
                else f"valid keys here: {', '.join(sorted(fields))}"
            )
            raise ConfigError(f"tune space: unknown config key '{where}': {hint}")
        node = section_model(fields[part].annotation)
        if node is None and i < len(parts) - 1:
            raise ConfigError(f"tune space: '{'.'.join(parts[: i + 1])}' is a value, not a section")
    if node is not None and node is not model:
        raise ConfigError(
            f"tune space: '{dotted}' is a section; name one of its keys ({', '.join(sorted(node.model_fields))})"
        )


def nested(flat: dict[str, Any]) -> dict[str, Any]:
    """{'optim.lr': 1e-3} -> {'optim': {'lr': 1e-3}}."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        set_dotted(out, key, value)
    return out


def trial_config(space: SpaceFile, params: dict[str, Any]) -> StrictModel:
    """The pipeline config of one trial: space.base with the sampled params on top."""
    return build(registry.config_class(space.pipeline), deep_merge(space.base, nested(params)))


def load_space(path: str | Path) -> SpaceFile:
    """Read and validate a space file against its pipeline's config (every key and every
    bound of every distribution is tried)."""
    raw = load_yaml(path)
    try:
        space = build(SpaceFile, raw)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None
    model = registry.config_class(space.pipeline)
    for key, dist in space.params.items():
        leaf_field(model, key)
        for value in dist.samples():
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{path}: params.{key}: {value} is not finite")
            try:
                trial_config(space, {key: value})
            except ConfigError as err:
                raise ConfigError(
                    f"{path}: params.{key} = {value!r} is rejected by the {space.pipeline} config: {err}"
                ) from None
    return space
