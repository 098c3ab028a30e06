"""Answer parsing shared by data loading, rewards and evaluation: GSM8K's ``#### n`` format, and
the ways pretrained models write a final answer (``extract_answer``)."""

from __future__ import annotations

import re

# Linear time on any text (a model that degenerates into whitespace writes exactly the inputs
# that made the former patterns quadratic and cubic): no two adjacent quantifiers can match the
# same characters, and the line's trailing whitespace is stripped in Python, not by the pattern.
_HASH = re.compile(r"####\s*([^\n]*)")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_CALC = re.compile(r"<<[^>]*>>")


def normalize_number(text: str) -> str | None:
    """'1,234' -> '1234', '3.50' -> '3.5', '7.0' -> '7'; None if ``text`` holds no number."""
    m = _NUMBER.search(text)
    if m is None:
        return None
    raw = m.group(0).replace(",", "")
    if "." in raw:
        raw = raw.rstrip("0").rstrip(".")
    return raw if raw not in ("", "-") else None


def final_segment(solution: str) -> str | None:
    """The raw text after the last ``####`` in a GSM8K-style solution (stripped); else None."""
    found = [seg.strip() for seg in _HASH.findall(solution)]
    found = [seg for seg in found if seg]
    return found[-1] if found else None


def final_answer(solution: str) -> str | None:
    """The answer after the last ``####`` in a GSM8K-style solution, normalized; else None."""
    segment = final_segment(solution)
    return None if segment is None else normalize_number(segment)


_ANSWER_IS = re.compile(r"answer\s*(?:is|:|=)[\s:$]*(-?\d[\d,]*(?:\.\d+)?)", re.IGNORECASE)
EXTRACTIONS = ("strict", "flexible")


def boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (nested braces kept); else None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j].strip()
    return None  # unclosed


def extract_answer(completion: str, how: str = "strict") -> str | None:
    """The final answer a completion gives, as raw text (compare it with ``canonical_answer``).

    ``strict``: only a ``#### n`` line counts (GSM8K's format, what the SFT demos teach).
    ``flexible``: as pretrained models write answers, first match wins: ``#### n``, then the
    last ``\\boxed{...}``, then the last "the answer is n" / "Answer: n", then the last number
    in the text."""
    if how not in EXTRACTIONS:
        raise ValueError(f"unknown answer extraction {how!r}: use one of {EXTRACTIONS}")
    segment = final_segment(completion)
    if segment is not None or how == "strict":
        return segment
    said = _ANSWER_IS.findall(completion)
    found = boxed(completion) or (said[-1] if said else None)
    if found:
        return found
    numbers = _NUMBER.findall(completion)
    return numbers[-1] if numbers else None


def canonical_answer(answer: str) -> str:
    """An answer as compared: a worked solution (GSM8K's raw ``answer`` column) gives its
    ``####`` segment; a plain number is normalized ('1,234' -> '1234'); anything else (``1/2``,
    ``\\frac{1}{2}``) is kept whole for symbolic comparison."""
    text = answer.strip()
    segment = final_segment(text)
    text = segment if segment is not None else text
    return (normalize_number(text) or text) if _NUMBER.fullmatch(text) else text


def strip_calculator(solution: str) -> str:
    """Drop GSM8K's ``<<48/2=24>>`` calculator annotations."""
    return _CALC.sub("", solution)
