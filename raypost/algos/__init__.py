"""RL algorithms as pure functions, picked by name from registries.

Importing this package registers every built-in estimator and loss.
"""

from raypost.algos import advantages, cispo, gspo, kl, losses, offpolicy, preference  # noqa: F401  (registration)
from raypost.algos.gae import Moments, explained_variance, gae, terminal_rewards, value_loss, whiten
from raypost.algos.losses import BatchCounts, LossParams
from raypost.algos.registry import ADVANTAGES, KL_ESTIMATORS, OFF_POLICY, POLICY_LOSSES, PREFERENCE_LOSSES

__all__ = [
    "ADVANTAGES",
    "KL_ESTIMATORS",
    "OFF_POLICY",
    "POLICY_LOSSES",
    "PREFERENCE_LOSSES",
    "BatchCounts",
    "LossParams",
    "Moments",
    "explained_variance",
    "gae",
    "terminal_rewards",
    "value_loss",
    "whiten",
]
