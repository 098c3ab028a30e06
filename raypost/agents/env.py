"""The environment interface of multi-turn episodes, and the tool-using environment.

An environment is one episode's state: ``reset(row)`` gives the opening chat messages, then each
``step(action)`` takes the model's turn (its text) and answers with observation messages, a
reward and whether the episode is over. Both are async: a tool may call a Serve app. The agent
loop (``raypost.agents.loop``) owns the tokens; an environment only ever sees and returns text.
Environments run in Ray actors (``raypost.agents.actors``), never in the learner's process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from raypost.algos.registry import Registry
from raypost.data.tool_calls import parse_tool_calls

Message = dict[str, str]  # {"role": ..., "content": ...}
Tool = Callable[..., Awaitable[str]]  # async tool(**arguments) -> its answer as text
ENVIRONMENTS = Registry("environment")  # name -> factory(options: dict) -> Environment


@dataclass
class StepResult:
    """What the environment answers to one model turn."""

    observation: list[Message]  # messages to append before the model's next turn (tool results, feedback)
    reward: float = 0.0  # this turn's reward, added to the episode's (0: reward at the end only)
    done: bool = False  # the episode is over; the model's last turn is its answer
    info: dict[str, Any] = field(default_factory=dict)  # "tool_calls": int, "parse_errors": int


class Environment(Protocol):
    async def reset(self, row: dict[str, Any]) -> list[Message]: ...

    async def step(self, action: str) -> StepResult: ...


class EnvBatch(Protocol):
    """The environments of a batch of episodes (one each), driven together by the agent loop:
    one call per turn for all of them (an actor call, when they live in a host actor)."""

    async def reset(self, rows: list[dict[str, Any]]) -> list[list[Message]]: ...

    async def step(self, actions: dict[int, str]) -> dict[int, StepResult]: ...


class LocalEnvs:
    """An ``EnvBatch`` of environments in this process (tests, a host actor's own episodes)."""

    def __init__(self, envs: list[Environment]) -> None:
        self.envs = envs

    async def reset(self, rows: list[dict[str, Any]]) -> list[list[Message]]:
        return list(await asyncio.gather(*[e.reset(r) for e, r in zip(self.envs, rows, strict=True)]))

    async def step(self, actions: dict[int, str]) -> dict[int, StepResult]:
        keys = list(actions)
        results = await asyncio.gather(*[self.envs[i].step(actions[i]) for i in keys])
        return dict(zip(keys, results))


class ToolEnv:
    """Answers the tool calls of each model turn (parsed from the model's own chat format) with one
    ``tool`` message each; a turn without a tool call ends the episode, its text the answer. A
    tool that raises, or runs past ``tool_timeout_s``, answers with an error message; an unknown
    tool or an unreadable call does too, and counts as a parse error."""

    def __init__(
        self,
        tools: dict[str, Tool],
        system_prompt: str,
        prompt_template: str = "{question}",
        tool_timeout_s: float = 10.0,
        max_calls_per_turn: int = 4,
    ) -> None:
        self.tools, self.system_prompt, self.prompt_template = tools, system_prompt, prompt_template
        self.tool_timeout_s, self.max_calls_per_turn = tool_timeout_s, max_calls_per_turn

    async def reset(self, row: dict[str, Any]) -> list[Message]:
        user = self.prompt_template.replace("{question}", str(row["question"]))
        return [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": user}]

    async def step(self, action: str) -> StepResult:
        parsed = parse_tool_calls(action, self.max_calls_per_turn)
        if not parsed.acted:
            return StepResult([], done=True, info={"tool_calls": 0, "parse_errors": 0})
        answers = [f"error: {e}" for e in parsed.errors]
        errors = len(parsed.errors)
        for call in parsed.calls:
            if call.name not in self.tools:
                errors += 1
                answers.append(f"error: no tool named {call.name!r}; tools: {', '.join(sorted(self.tools))}")
            else:
                answers.append(await self._run(call.name, call.arguments))
        observation = [{"role": "tool", "content": a} for a in answers]
        return StepResult(observation, info={"tool_calls": len(parsed.calls), "parse_errors": errors})

    async def _run(self, name: str, arguments: dict[str, Any]) -> str:
        try:
            return str(await asyncio.wait_for(self.tools[name](**arguments), self.tool_timeout_s))
        except asyncio.TimeoutError:
            return f"error: {name} did not answer within {self.tool_timeout_s:g} s"
        except TypeError as err:  # wrong or missing arguments
            return f"error: bad arguments for {name}: {err}"
        except Exception as err:  # noqa: BLE001 - a tool's failure is the model's observation
            return f"error: {name} failed: {str(err)[:300] or type(err).__name__}"
