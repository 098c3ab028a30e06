"""Multi-turn agent rollouts: the environment, its limits and its actors (``GRPOConfig.agent``)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from raypost.config.base import StrictModel


class AgentConfig(StrictModel):
    """GRPO on multi-turn episodes instead of single completions (``env`` set)."""

    env: str | None = Field(
        None,
        min_length=1,
        description="Environment: a registered name (calculator) or 'package.module:factory'. None: single-turn "
        "GRPO (one completion per sample).",
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="Passed to the environment's factory (system_prompt, prompt_template...)."
    )
    max_turns: int = Field(4, ge=1, le=256, description="Model turns per episode.")
    max_episode_tokens: int = Field(
        384, ge=8, le=1 << 20, description="Tokens after the prompt per episode: model turns and observations."
    )
    tool_timeout_s: float = Field(
        10.0, gt=0.0, le=3600.0, description="A tool call past this answers with an error observation."
    )
    max_calls_per_turn: int = Field(4, ge=1, le=64, description="Tool calls run per model turn; more are errors.")
    env_timeout_s: float = Field(
        60.0, gt=0.0, le=86400.0, description="One reset or step on an environment actor; past it the episode fails."
    )
    num_env_actors: int = Field(2, ge=1, le=100_000, description="Environment host actors (episodes round-robin).")
    cpus_per_env_actor: float = Field(0.05, ge=0.0, le=1024.0, description="CPUs each host actor reserves.")
    episode_attempts: int = Field(
        3,
        ge=1,
        le=100,
        description="Tries of an episode whose environment actor died; past them its group fails "
        "(dropped within algo.max_failed_groups).",
    )
    serve_tool: bool = Field(
        True, description="Run a built-in environment's tool as its own Serve app (calculator); else in the actor."
    )

    def env_options(
        self, tool_app: str | None, system_prompt: str | None = None, prompt_template: str = "{question}"
    ) -> dict[str, Any]:
        """What the environment factory gets: ``options`` over the data section's system prompt and
        template (so an SFT warm-up and the episodes open alike), plus the limits and the tool app."""
        return {
            "system_prompt": system_prompt,
            "prompt_template": prompt_template,
            **self.options,
            "tool_timeout_s": self.tool_timeout_s,
            "max_calls_per_turn": self.max_calls_per_turn,
            "tool_app": tool_app,
        }
