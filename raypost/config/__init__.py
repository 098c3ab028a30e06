"""Typed, validated configuration (pydantic), loaded from YAML with dotted CLI overrides."""

from raypost.config.base import ConfigError, StrictModel, build, dump_yaml, load_config, parse_overrides
from raypost.config.pipelines import SFTConfig, SFTTrainConfig
from raypost.config.sections import (
    DataConfig,
    DeepSpeedConfig,
    EvalConfig,
    LoraConfig,
    ModelConfig,
    OptimConfig,
    ResourcesConfig,
    RunConfig,
    SyntheticTaskConfig,
    TinyModelConfig,
)

__all__ = [
    "ConfigError",
    "StrictModel",
    "build",
    "dump_yaml",
    "load_config",
    "parse_overrides",
    "SFTConfig",
    "SFTTrainConfig",
    "DataConfig",
    "DeepSpeedConfig",
    "EvalConfig",
    "LoraConfig",
    "ModelConfig",
    "OptimConfig",
    "ResourcesConfig",
    "RunConfig",
    "SyntheticTaskConfig",
    "TinyModelConfig",
]
