"""Registries: a typed config field names the algorithm; one small module implements it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable)


class Registry(dict):
    """name -> function, filled by the ``register`` decorator in each algorithm's module."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def register(self, name: str) -> Callable[[F], F]:
        def deco(fn: F) -> F:
            if name in self:
                raise ValueError(f"{self.kind} '{name}' registered twice")
            self[name] = fn
            return fn

        return deco

    def get_fn(self, name: str) -> Callable:
        if name not in self:
            raise KeyError(f"unknown {self.kind} '{name}'; known: {', '.join(sorted(self))}")
        return self[name]


ADVANTAGES = Registry("advantage estimator")
POLICY_LOSSES = Registry("policy loss")
KL_ESTIMATORS = Registry("KL estimator")
OFF_POLICY = Registry("off-policy correction")
PREFERENCE_LOSSES = Registry("preference loss")
