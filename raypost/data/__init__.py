"""Ray Data preprocessing: sources, validation with rejects, chat template, tokenization, packing.

The Ray Data names (``preprocess``'s) load on first use, so the learners' steps, which need only
``IGNORE_INDEX`` and the tokenization helpers, import no Ray (``benchmarks/gpu_check.py`` runs
them on a machine without it)."""

from __future__ import annotations

import importlib
from typing import Any

from raypost.data.answers import final_answer, normalize_number
from raypost.data.tokenize import IGNORE_INDEX, completion_ids, prompt_ids, sft_example

_RAY_DATA = ("DataError", "SplitCounts", "read_splits", "sft_rows", "split_rejects")

__all__ = [
    "final_answer",
    "normalize_number",
    *_RAY_DATA,
    "IGNORE_INDEX",
    "completion_ids",
    "prompt_ids",
    "sft_example",
]


def __getattr__(name: str) -> Any:
    if name in _RAY_DATA:
        return getattr(importlib.import_module("raypost.data.preprocess"), name)
    raise AttributeError(f"module 'raypost.data' has no attribute {name!r}")
