"""The pipelines: one module each, found through the registry (``raypost --help`` lists them)."""

from raypost.pipelines.registry import PBTHooks, Pipeline, config_class, config_for_file, get, names, tunable

__all__ = ["PBTHooks", "Pipeline", "config_class", "config_for_file", "get", "names", "tunable"]
