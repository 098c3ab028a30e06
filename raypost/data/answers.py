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


def final_answer(solution: str) -> str | None:
    """The answer after the last ``####`` in a GSM8K-style solution, normalized; else None."""
    found = _HASH.findall(solution)
    if not found:
        return None
    return normalize_number(found[-1])


def strip_calculator(solution: str) -> str:
    """Drop GSM8K's ``<<48/2=24>>`` calculator annotations."""
    return _CALC.sub("", solution)
