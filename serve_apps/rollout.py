"""The vLLM rollout replicas for ``serve run serve_apps.rollout:app_builder model=PATH``.

The app lives in ``raypost.serve.entry``; ``raypost serve-rollout --help`` runs it on its own.
"""

from raypost.serve.entry import RolloutAppConfig, _split
from raypost.serve.entry import rollout_app as app_builder

__all__ = ["RolloutAppConfig", "_split", "app_builder"]
