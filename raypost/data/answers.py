"""Answer parsing shared by data loading, rewards and evaluation (GSM8K ``#### n`` format)."""

from __future__ import annotations

import re

_HASH = re.compile(r"####\s*(.+?)\s*$", re.MULTILINE)
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
    found = _HASH.findall(solution)
    return found[-1] if found else None


def final_answer(solution: str) -> str | None:
    """The answer after the last ``####`` in a GSM8K-style solution, normalized; else None."""
    segment = final_segment(solution)
    return None if segment is None else normalize_number(segment)


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
