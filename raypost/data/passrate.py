"""Pure parts of the pass-rate pass (``raypost.phases.passrate`` runs it): a prompt's pass rate
from its samples' rewards, the band kept, the curriculum's sort key and the pass's summary."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any


def pass_rate(rewards: Sequence[float], pass_reward: float) -> float:
    """The share of a prompt's samples whose reward is at least ``pass_reward``."""
    if not rewards:
        raise ValueError("a pass rate needs at least one sample")
    return sum(r >= pass_reward for r in rewards) / len(rewards)


def in_band(rate: float, low: float, high: float) -> bool:
    """Kept: ``low < rate < high``, strictly, so 0 and 1 drop the unsolved and the solved."""
    return low < rate < high


def seeded_key(row_id: str, seed: int) -> float:
    """A row's place in a seeded order, in [0, 1): the same for the same id and seed on any
    machine (a hash, not Python's salted ``hash``)."""
    digest = hashlib.sha256(f"{seed}:{row_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def easy_first_key(row_id: str, rate: float, seed: int, samples: int) -> float:
    """Sort key of the easy-to-hard curriculum (sorted descending): the pass rate, with a seeded
    tie-break below the gap between two rates of ``samples`` samples (1 / samples), so prompts
    of one rate are shuffled and never cross into another rate."""
    return rate + seeded_key(row_id, seed) / (2 * samples)


def summary(rates: Sequence[float], low: float, high: float) -> dict[str, Any]:
    """What the pass saw: prompts scored, kept, dropped below and above the band, the mean pass
    rate and its histogram (rate rounded to 2 places -> prompts)."""
    hist: dict[str, int] = {}
    for r in rates:
        hist[f"{r:.2f}"] = hist.get(f"{r:.2f}", 0) + 1
    return {
        "scored": len(rates),
        "kept": sum(in_band(r, low, high) for r in rates),
        "dropped_unsolved": sum(r <= low for r in rates),
        "dropped_solved": sum(r >= high for r in rates),
        "mean_pass_rate": sum(rates) / len(rates) if rates else None,
        "histogram": dict(sorted(hist.items())),
    }
