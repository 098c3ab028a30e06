"""Named reward functions, resolved from config, combined as a weighted sum.

A reward function has TRL's signature and is always called with keywords, as TRL's
GRPOTrainer calls it: ``fn(prompts=..., completions=..., **columns) -> list[float | None]``.
So ``trl.rewards:accuracy_reward`` (which reads a ``solution`` column) works unchanged.
``None`` (TRL: "no opinion on this sample") counts as 0 in the weighted sum.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from raypost.rewards.verifiers import accuracy_reward, format_reward
from raypost.utils.refs import resolve_ref

RewardFn = Callable[..., list]
BUILTIN: dict[str, RewardFn] = {"accuracy": accuracy_reward, "format": format_reward}


class RewardFunctionError(RuntimeError):
    """A reward function raised or returned the wrong number of scores; names the function."""

    def __init__(self, name: str, detail: str) -> None:
        super().__init__(f"reward function '{name}' failed: {detail}")
        self.name = name


def resolve(ref: str) -> RewardFn:
    """A built-in name (``accuracy``, ``format``) or an import path ``package.module:function``."""
    return resolve_ref(ref, BUILTIN, "reward")


@dataclass(frozen=True)
class WeightedReward:
    name: str
    fn: RewardFn
    weight: float
    conversational: bool = False
    kwargs: dict[str, Any] = field(default_factory=dict)  # fixed arguments from the reward spec


def call(
    reward: WeightedReward, prompts: Sequence[Any], completions: Sequence[Any], columns: dict[str, Sequence[Any]]
) -> list[float | None]:
    """One reward function over a batch, checked for length; errors name the function."""
    if reward.conversational:  # TRL's format for chat datasets
        prompts = [[{"role": "user", "content": p}] for p in prompts]
        completions = [[{"role": "assistant", "content": c}] for c in completions]
    try:
        out = reward.fn(
            prompts=list(prompts),
            completions=list(completions),
            **{k: list(v) for k, v in columns.items()},
            **reward.kwargs,
        )
    except Exception as err:  # a user function failing must not take the service down
        raise RewardFunctionError(reward.name, f"{type(err).__name__}: {err}") from err
    if not isinstance(out, (list, tuple)) or len(out) != len(completions):
        raise RewardFunctionError(
            reward.name,
            f"returned {type(out).__name__} of length "
            f"{len(out) if hasattr(out, '__len__') else '?'}, expected {len(completions)} floats",
        )
    return [None if v is None else float(v) for v in out]


def combine(
    rewards: Sequence[WeightedReward],
    prompts: Sequence[Any],
    completions: Sequence[Any],
    columns: dict[str, Sequence[Any]],
) -> tuple[list[float], dict[str, list[float | None]]]:
    """Weighted sum of every reward; also each reward's raw scores by name."""
    per_name = {r.name: call(r, prompts, completions, columns) for r in rewards}
    total = [0.0] * len(completions)
    for r in rewards:
        for i, v in enumerate(per_name[r.name]):
            if v is not None:
                total[i] += r.weight * v
    return total, per_name


def score_items(
    rewards: Sequence[WeightedReward], needs_labels: set[str], items: Sequence[tuple[str, str, str | None]]
) -> list[Any]:
    """Scores of (prompt, completion, label or None) items that concurrent requests sent and
    ``serve.batch`` merged: per item ``{"reward", "scores"}``, or the ``RewardFunctionError`` of its
    group. Labelled and unlabelled items are scored as two groups, so an unlabelled request
    never takes the label-based rewards from another request's items (labelled items get every
    reward; unlabelled ones the rewards that need no labels)."""
    out: list[Any] = [None] * len(items)
    for labelled in (True, False):
        idx = [i for i, item in enumerate(items) if (item[2] is not None) == labelled]
        if not idx:
            continue
        labels = [items[i][2] for i in idx]
        columns = {"answer": labels, "solution": labels} if labelled else {}
        active = [r for r in rewards if labelled or r.name not in needs_labels]
        try:
            total, per_name = combine(active, [items[i][0] for i in idx], [items[i][1] for i in idx], columns)
        except RewardFunctionError as err:
            for i in idx:
                out[i] = err
            continue
        for j, i in enumerate(idx):
            out[i] = {"reward": total[j], "scores": {k: v[j] for k, v in per_name.items()}}
    return out
