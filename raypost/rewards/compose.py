"""Named reward functions, resolved from config, combined as a weighted sum.

A reward function has TRL's signature and is always called with keywords, as TRL's
GRPOTrainer calls it: ``fn(prompts=..., completions=..., **columns) -> list[float | None]``.
So ``trl.rewards:accuracy_reward`` (which reads a ``solution`` column) works unchanged.
``None`` (TRL: "no opinion on this sample") counts as 0 in the weighted sum.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from raypost.rewards.verifiers import accuracy_reward, format_reward

RewardFn = Callable[..., list]
BUILTIN: dict[str, RewardFn] = {"accuracy": accuracy_reward, "format": format_reward}


class RewardFunctionError(RuntimeError):
    """A reward function raised or returned the wrong number of scores; names the function."""

    def __init__(self, name: str, detail: str) -> None:
        super().__init__(f"reward function '{name}' failed: {detail}")
        self.name = name


def resolve(ref: str) -> RewardFn:
    """A built-in name (``accuracy``, ``format``) or an import path ``package.module:function``."""
    if ref in BUILTIN:
        return BUILTIN[ref]
    module, sep, attr = ref.partition(":")
    if not sep:
        raise ValueError(f"unknown reward '{ref}': use one of {sorted(BUILTIN)} or 'package.module:function'")
    fn = getattr(importlib.import_module(module), attr, None)
    if not callable(fn):
        raise ValueError(f"reward '{ref}': {module} has no callable '{attr}'")
    return fn


@dataclass(frozen=True)
class WeightedReward:
    name: str
    fn: RewardFn
    weight: float
    conversational: bool = False
    kwargs: dict[str, Any] = field(default_factory=dict)  # fixed arguments from the reward spec


def call(reward: WeightedReward, prompts: Sequence[Any], completions: Sequence[Any],
         columns: dict[str, Sequence[Any]]) -> list[float | None]:
    """One reward function over a batch, checked for length; errors name the function."""
    if reward.conversational:  # TRL's format for chat datasets
        prompts = [[{"role": "user", "content": p}] for p in prompts]
        completions = [[{"role": "assistant", "content": c}] for c in completions]
    try:
        out = reward.fn(prompts=list(prompts), completions=list(completions),
                        **{k: list(v) for k, v in columns.items()}, **reward.kwargs)
    except Exception as err:  # a user function failing must not take the service down
        raise RewardFunctionError(reward.name, f"{type(err).__name__}: {err}") from err
    if not isinstance(out, (list, tuple)) or len(out) != len(completions):
        raise RewardFunctionError(reward.name, f"returned {type(out).__name__} of length "
                                  f"{len(out) if hasattr(out, '__len__') else '?'}, expected {len(completions)} floats")
    return [None if v is None else float(v) for v in out]


def combine(rewards: Sequence[WeightedReward], prompts: Sequence[Any], completions: Sequence[Any],
            columns: dict[str, Sequence[Any]]) -> tuple[list[float], dict[str, list[float | None]]]:
    """Weighted sum of every reward; also each reward's raw scores by name."""
    per_name = {r.name: call(r, prompts, completions, columns) for r in rewards}
    total = [0.0] * len(completions)
    for r in rewards:
        for i, v in enumerate(per_name[r.name]):
            if v is not None:
                total[i] += r.weight * v
    return total, per_name
