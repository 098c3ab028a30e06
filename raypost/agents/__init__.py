"""Multi-turn, tool-using agents: environments on Ray actors, tool calls in the model's own chat
format, and an agent loop that keeps every turn's token ids (tokens in, tokens out)."""

from raypost.agents.actors import EnvHost, EnvPool, EpisodeLostError, RemoteEnvs, env_factory
from raypost.agents.calculator import CalculatorError, calculate
from raypost.agents.env import ENVIRONMENTS, EnvBatch, Environment, LocalEnvs, Message, StepResult, Tool, ToolEnv
from raypost.agents.episode import Episode, observation_ids, prompt_ids
from raypost.agents.loop import Limits, run_episodes
from raypost.agents.rollout import AgentRollout
from raypost.data.tool_calls import Parsed, ToolCall, format_tool_call, parse_tool_calls

__all__ = [
    "ENVIRONMENTS",
    "AgentRollout",
    "CalculatorError",
    "EnvBatch",
    "EnvHost",
    "EnvPool",
    "Environment",
    "Episode",
    "EpisodeLostError",
    "Limits",
    "LocalEnvs",
    "Message",
    "Parsed",
    "RemoteEnvs",
    "StepResult",
    "Tool",
    "ToolCall",
    "ToolEnv",
    "calculate",
    "env_factory",
    "format_tool_call",
    "observation_ids",
    "parse_tool_calls",
    "prompt_ids",
    "run_episodes",
]
