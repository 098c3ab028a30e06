"""Ray Tune sweeps over the pipelines: space DSL, trials, sweep driver, outputs."""

from raypost.tune.space import Distribution, SpaceFile, load_space, trial_config

__all__ = ["Distribution", "SpaceFile", "load_space", "trial_config"]
