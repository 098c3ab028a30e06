"""Pipeline name -> config class. Example YAMLs are named ``<pipeline>_<what>.yaml``."""

from __future__ import annotations

from pathlib import Path

from raypost.config.base import ConfigError, StrictModel, build, load_yaml
from raypost.config.distill import DistillConfig
from raypost.config.grpo import GRPOConfig
from raypost.config.pipelines import SFTConfig
from raypost.config.reward_model import RewardModelConfig

PIPELINE_CONFIGS: dict[str, type[StrictModel]] = {"sft": SFTConfig, "grpo": GRPOConfig, "distill": DistillConfig,
                                                  "reward_model": RewardModelConfig}


def register(name: str, config_cls: type[StrictModel]) -> None:
    PIPELINE_CONFIGS[name] = config_cls


def config_class(pipeline: str) -> type[StrictModel]:
    if pipeline not in PIPELINE_CONFIGS:
        raise ConfigError(f"unknown pipeline '{pipeline}'; known: {', '.join(sorted(PIPELINE_CONFIGS))}")
    return PIPELINE_CONFIGS[pipeline]


def config_for_file(path: str | Path) -> StrictModel:
    """Load an example YAML with the config class its file-name prefix names."""
    name = Path(path).name
    prefix = max((p for p in PIPELINE_CONFIGS if name.startswith(p + "_")), key=len, default=None)
    if prefix is None:
        raise ConfigError(f"{name}: name it '<pipeline>_<what>.yaml' with pipeline in {sorted(PIPELINE_CONFIGS)}")
    return build(PIPELINE_CONFIGS[prefix], load_yaml(path))
