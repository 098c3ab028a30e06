"""The reward service for ``serve run serve_apps/reward_serve.yaml`` (run from the project root).

The app lives in ``raypost.serve.entry``; ``raypost serve-reward --help`` runs it on its own.
"""

from raypost.serve.entry import REWARD_ALIASES as ALIASES
from raypost.serve.entry import config_from_args
from raypost.serve.entry import reward_app as app_builder

__all__ = ["ALIASES", "app_builder", "config_from_args"]
