"""Rule-based rewards with TRL's reward-function signature.

``fn(prompts, completions, **kwargs) -> list[float]``; dataset columns arrive as keyword
lists (here ``answer``), so these plug into TRL's GRPOTrainer unchanged and TRL's own
reward functions plug into raypost.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from raypost.data.answers import canonical_answer, extract_answer
from raypost.rewards.symbolic import SymbolicChecker

_FORMAT = re.compile(r"####\s*-?\d[\d,]*(?:\.\d+)?\s*$")
_PLAIN = re.compile(r"-?\d+(?:\.\d+)?")  # a number as ``canonical_answer`` normalizes it


def _text(completion: Any) -> str:
    """TRL passes strings, or chat lists [{'role': 'assistant', 'content': ...}]."""
    if isinstance(completion, list):
        return "".join(m.get("content", "") for m in completion if isinstance(m, dict))
    return str(completion)


def answers_match(completion: str, gold: str, extract: str = "strict") -> bool | None:
    """The completion's final answer equals the gold answer: exact after normalization, else
    math-verify's symbolic equivalence (e.g. '0.5' vs '1/2'). ``gold`` is a final answer or a
    whole worked solution (its '####' segment counts). ``extract``: how the completion's answer
    is read (``raypost.data.answers.extract_answer``: 'strict' '#### n' or 'flexible'). None: the
    symbolic check ran out of time, so there is no verdict."""
    segment = extract_answer(completion, extract)
    if segment is None:
        return False
    pred, gold_n = canonical_answer(segment), canonical_answer(str(gold))
    if pred == gold_n:
        return True
    if _PLAIN.fullmatch(pred) and _PLAIN.fullmatch(gold_n):
        return float(pred) == float(gold_n)  # two plain numbers: no symbolic form to compare
    return symbolic_checker().equal(gold_n, pred)


@functools.lru_cache(maxsize=1)
def symbolic_checker() -> SymbolicChecker:
    """This process's math-verify checker (its worker process is spawned on first use off the
    main thread)."""
    return SymbolicChecker()


def accuracy_reward(
    prompts: list[Any], completions: list[Any], answer: list[str], extract: str = "strict", **kwargs: Any
) -> list[float | None]:
    """1.0 when the completion's final answer matches ``answer`` (GSM8K and the synthetic task).
    ``extract='strict'`` reads only a '#### n' line; 'flexible' also \\boxed{}, "the answer is n"
    and the last number (a reward spec's ``kwargs: {extract: flexible}``). None (TRL's "no opinion")
    where the symbolic check timed out: the sum counts it as 0, and the score says it was not made."""
    verdicts = [answers_match(_text(c), a, extract) for c, a in zip(completions, answer)]
    return [None if v is None else float(v) for v in verdicts]


def format_reward(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
    """1.0 when the completion ends with a '#### <number>' line."""
    return [1.0 if _FORMAT.search(_text(c).strip()) else 0.0 for c in completions]
