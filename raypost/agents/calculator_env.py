"""The calculator environment: multi-step arithmetic with one tool, ``calculator(expression)``.

The tool runs on the calculator Serve app (``options["tool_app"]``: its name), or in the host
actor's process when no app is named. Registered as ``calculator``.
"""

from __future__ import annotations

from typing import Any

from raypost.agents.calculator import CalculatorError, calculate
from raypost.agents.env import ENVIRONMENTS, ToolEnv
from raypost.data.tool_calls import format_tool_call

SYSTEM_PROMPT = (
    "You have a calculator. To use it, reply with only\n"
    + format_tool_call("calculator", {"expression": "12 * (3 + 4)"})
    + "\nand wait for its result. When you know the answer, end with a line '#### <number>'."
)


async def calculate_here(expression: str) -> str:
    """The tool's answer: the value, or the error the model should read."""
    try:
        return calculate(expression)
    except CalculatorError as err:
        return f"error: {err}"


def served_calculator(app: str) -> Any:
    """The tool as a call to the calculator Serve app named ``app``."""

    async def calculator(expression: str) -> str:
        from ray import serve

        return await serve.get_app_handle(app).calculate.remote(expression)

    return calculator


@ENVIRONMENTS.register("calculator")
def calculator_env(options: dict[str, Any]) -> ToolEnv:
    """options: tool_app (None: compute in this process), system_prompt (None: ``SYSTEM_PROMPT``),
    prompt_template, tool_timeout_s, max_calls_per_turn."""
    app = options.get("tool_app")
    tool = served_calculator(app) if app else calculate_here
    return ToolEnv(
        {"calculator": tool},
        options.get("system_prompt") or SYSTEM_PROMPT,
        options.get("prompt_template") or "{question}",
        float(options.get("tool_timeout_s", 10.0)),
        int(options.get("max_calls_per_turn", 4)),
    )
