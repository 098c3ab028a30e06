"""Tool calls read in the model's own chat format.

- Hermes / Qwen2.5: one ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` per call;
- SmolLM2-Instruct: ``<tool_call>[{"name": ..., "arguments": {...}}, ...]</tool_call>``, a JSON list.

``arguments`` may also be a JSON string (the OpenAI wire format). A tag that can't be read is a
parse error with its reason, never an exception: the episode answers it with an error observation.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_TAG = re.compile(re.escape(OPEN) + r"(.*?)(" + re.escape(CLOSE) + r"|\Z)", re.S)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass
class Parsed:
    """What a model turn asked for."""

    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # one reason per tag or call that could not be read
    text: str = ""  # the turn with its tool-call tags removed

    @property
    def acted(self) -> bool:
        """The turn tried to call a tool (well-formed or not)."""
        return bool(self.calls or self.errors)


def _call(obj: Any) -> ToolCall:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        raise ValueError('a tool call is a JSON object with a "name" string and an "arguments" object')
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        args = json.loads(args) if args.strip() else {}
    if not isinstance(args, dict):
        raise ValueError(f'"arguments" of {obj["name"]!r} must be a JSON object, not {type(args).__name__}')
    return ToolCall(obj["name"], args)


def parse_tool_calls(text: str, max_calls: int = 8) -> Parsed:
    """The tool calls in ``text``; past ``max_calls`` the rest are errors."""
    out = Parsed(text=_TAG.sub("", text).strip())
    for m in _TAG.finditer(text):
        if not m.group(2):
            out.errors.append(f"{OPEN} is not closed by {CLOSE}")
            continue
        try:
            obj = json.loads(m.group(1))
            items = obj if isinstance(obj, list) else [obj]
            calls = [_call(o) for o in items]
        except (ValueError, RecursionError) as err:  # json.JSONDecodeError is a ValueError
            out.errors.append(f"could not read the tool call: {err}"[:300])
            continue
        for c in calls:
            if len(out.calls) >= max_calls:
                out.errors.append(f"more than {max_calls} tool calls in one turn; {c.name!r} was not run")
            else:
                out.calls.append(c)
    return out


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """A call as a Hermes/Qwen2.5 model writes it (demonstrations, tests)."""
    return f"{OPEN}\n{json.dumps({'name': name, 'arguments': arguments})}\n{CLOSE}"
