"""Row validation: every source's rows become one schema, or a reject with a reason.

Schema of a normalized row (all strings): ``id``, ``question``, ``solution`` (worked
answer used as the SFT target), ``answer`` (normalized final answer), ``prior_turns`` (JSON list of
chat messages between the user turn and the SFT target: earlier assistant and tool turns of a
multi-turn demo, in the prompt and not trained; '' for none), ``reject``
(empty when the row is good), ``raw`` (the original row as JSON, kept for rejects) and
``where`` (``<file>:<line>`` of the row in its source; the rejects file shows it).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from raypost.data.answers import final_answer, normalize_number, strip_calculator

COLUMNS = ["id", "question", "solution", "answer", "prior_turns", "reject", "raw", "where"]
BOM = b"\xef\xbb\xbf"
MAX_DEPTH_HINT = "JSON nested too deeply to parse; flatten the row"


def row_id(question: str, answer: str) -> str:
    return hashlib.sha1(f"{question}\x00{answer}".encode()).hexdigest()[:16]


def _raw(row: Any) -> str:
    try:
        return json.dumps(row, default=str)[:2000]
    except (TypeError, ValueError):
        return repr(row)[:2000]


def reject(reason: str, raw: str, columns: list[str] = COLUMNS, where: str = "") -> dict[str, str]:
    """A rejected row: ``reason`` says which field is wrong and why, ``where`` which row it was."""
    return {**{c: "" for c in columns}, "reject": reason, "raw": raw, "where": where}


def normalize_row(row: Any, prompt_field: str, answer_field: str) -> dict[str, str]:
    """Validate one source row; return a normalized row or a reject naming the field."""
    raw = _raw(row)
    if not isinstance(row, dict):
        return reject(f"row is {type(row).__name__}, expected an object", raw)
    question, answer = row.get(prompt_field), row.get(answer_field)
    for field, value in ((prompt_field, question), (answer_field, answer)):
        if value is None:
            return reject(f"missing field '{field}'", raw)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and field == answer_field:
            continue
        if not isinstance(value, str):
            return reject(f"field '{field}' is {type(value).__name__}, expected a string", raw)
        if not value.strip():
            return reject(f"field '{field}' is empty", raw)
    answer_text = str(answer).strip()
    final = final_answer(answer_text) if "####" in answer_text else normalize_number(answer_text)
    if final is None:
        return reject(f"field '{answer_field}' has no numeric final answer (expected '#### <number>' or a number)", raw)
    solution = strip_calculator(answer_text) if "####" in answer_text else f"#### {final}"
    rid = str(row["id"]) if isinstance(row.get("id"), (str, int)) else row_id(question, answer_text)
    return {
        "id": rid,
        "question": question.strip(),
        "solution": solution,
        "answer": final,
        "prior_turns": "",
        "reject": "",
        "raw": "",
        "where": "",
    }


@dataclass(frozen=True)
class RowSchema:
    """How one kind of source row is validated: the output ``columns`` (with ``reject`` and
    ``raw``) and ``normalize(row) -> normalized row or reject``."""

    columns: list[str]
    normalize: Callable[[Any], dict[str, str]]

    def parse_line(self, line: str | bytes, max_bytes: int = 1 << 20) -> dict[str, str]:
        """One JSONL line (``\\n`` excluded) -> normalized row, or a reject: over ``max_bytes``,
        invalid UTF-8, bad JSON, JSON nested too deeply, or a row that fails validation. Never raises."""
        if isinstance(line, bytes):
            if len(line) > max_bytes:
                return self.reject(
                    f"row too large: {len(line)} bytes > data.max_row_bytes={max_bytes}; raise it or split the row",
                    line[:2000].decode("utf-8", "replace"),
                )
            try:
                line = line.removesuffix(b"\r").decode("utf-8")
            except UnicodeDecodeError as err:
                raw = line[:2000].decode("utf-8", "replace")
                return self.reject(f"invalid UTF-8: byte {err.start} of the line; re-encode the file as UTF-8", raw)
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            return self.reject(f"bad JSON: {err.msg} at column {err.colno}", line[:2000])
        except RecursionError:
            return self.reject(f"bad JSON: {MAX_DEPTH_HINT}", line[:2000])
        return self.checked(row, line[:2000])

    def checked(self, row: Any, raw: str) -> dict[str, str]:
        """``normalize(row)``; a row it cannot handle at all is a reject, not an error."""
        try:
            return self.normalize(row)
        except RecursionError:
            return self.reject(f"bad row: {MAX_DEPTH_HINT}", raw)
        except (TypeError, ValueError, AttributeError) as err:
            return self.reject(f"bad row: {type(err).__name__}: {err}", raw)

    def reject(self, reason: str, raw: str) -> dict[str, str]:
        return reject(reason, raw, self.columns)


def qa_schema(prompt_field: str, answer_field: str) -> RowSchema:
    """Question/answer rows (SFT, GRPO prompts): GSM8K, the synthetic task, any QA data."""
    return RowSchema(COLUMNS, partial(normalize_row, prompt_field=prompt_field, answer_field=answer_field))
