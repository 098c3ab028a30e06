"""raypost: Ray-native LLM post-training (SFT, GRPO; Serve rollouts and rewards).

Public API: typed configs (``raypost.config``), the pipeline phases (``raypost.phases``),
the Serve apps (``raypost.serve``), algorithms (``raypost.algos``) and rewards
(``raypost.rewards``). Entry scripts live in ``pipelines/`` and ``serve_apps/``.
"""

from raypost.config import ConfigError, SFTConfig, load_config
from raypost.config.grpo import GRPOConfig
from raypost.config.serve import RewardServiceConfig, RolloutConfig
from raypost.utils.logs import configure_raypost_logger

configure_raypost_logger()

__version__ = "0.1.0"
__all__ = [
    "ConfigError",
    "GRPOConfig",
    "RewardServiceConfig",
    "RolloutConfig",
    "SFTConfig",
    "load_config",
    "__version__",
]
