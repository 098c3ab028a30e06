"""Environments for the agent tests, loaded by import path in the environment host actors."""

from __future__ import annotations

import asyncio
from typing import Any

from raypost.agents import StepResult, ToolEnv


async def boom(**_: Any) -> str:
    raise RuntimeError("the tool's backend is down")


async def sleep(seconds: float = 30.0) -> str:
    await asyncio.sleep(seconds)
    return "woke up"


async def add(a: int, b: int) -> str:
    return str(a + b)


def faulty_tools(options: dict[str, Any]) -> ToolEnv:
    """Three tools: one that raises, one that hangs, one that works."""
    return ToolEnv({"boom": boom, "sleep": sleep, "add": add}, "Use tools.", "{question}", options["tool_timeout_s"])


class TwoTurns:
    """Every episode has two model turns: the first is answered 'Now the final answer.', the
    second ends it; ``step_s`` slows each step (to kill the host actor in the middle)."""

    def __init__(self, options: dict[str, Any]) -> None:
        self.turn, self.step_s = 0, float(options.get("step_s", 0.0))

    async def reset(self, row: dict[str, Any]) -> list[dict[str, str]]:
        return [{"role": "user", "content": row["question"]}]

    async def step(self, action: str) -> StepResult:
        await asyncio.sleep(self.step_s)
        self.turn += 1
        if self.turn >= 2:
            return StepResult([], reward=0.0, done=True)
        return StepResult([{"role": "tool", "content": "Now the final answer."}], info={"tool_calls": 1})


def two_turns(options: dict[str, Any]) -> TwoTurns:
    return TwoTurns(options)
