"""OpenEnv environments, unchanged, as raypost environments (registered as ``openenv``).

An OpenEnv environment (``openenv-core``: a subclass of ``openenv.core.env_server.Environment``,
the class its HTTP server wraps, as TRL uses it) answers ``reset()`` and ``step(action)`` with a
typed ``Observation`` carrying ``done`` and ``reward``. Here it runs in the environment host
actor, in-process, through its ``reset_async`` / ``step_async``:

- the model's turn becomes the environment's ``Action``: its text in ``action_field`` (default:
  the action type's only required field), or, when the text is a JSON object, those fields;
  an action that does not validate answers with an ``error: ...`` message (a parse error), as a
  bad tool call does;
- an observation becomes one chat message (``observation_role``): its one field's value, or its
  fields as JSON; ``done`` ends the episode and ``reward`` is the turn's reward;
- the opening is the system prompt, then the row's question (if any) and the reset observation.

options: ``env`` and ``action`` (import paths ``package.module:Class``), ``env_kwargs``,
``action_field``, ``observation_role`` (default ``user``), ``system_prompt``, ``prompt_template``.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

from raypost.agents.env import ENVIRONMENTS, Message, StepResult
from raypost.utils.refs import resolve_ref

RESERVED = {"done", "reward", "metadata"}  # Observation's own fields: not shown to the model


def render(obs: Any) -> str:
    """An observation as the model reads it: its one field, or its fields as JSON."""
    fields = {k: v for k, v in obs.model_dump().items() if k not in RESERVED}
    if len(fields) == 1:
        return str(next(iter(fields.values())))
    return json.dumps(fields, default=str)


def _why(err: Exception) -> str:
    """A short reason the model can read: pydantic's first error as ``field: message``."""
    errors = getattr(err, "errors", None)
    if callable(errors):
        first = errors()[0]
        return f"{'.'.join(map(str, first['loc']))}: {first['msg']}"[:200]
    return str(err)[:200]


class OpenEnvAdapter:
    """One episode of an OpenEnv environment instance, as a raypost ``Environment``."""

    def __init__(self, env: Any, action_type: Any, options: dict[str, Any]) -> None:
        self.env, self.action_type = env, action_type
        required = [n for n, f in action_type.model_fields.items() if f.is_required()]
        self.field = options.get("action_field") or (required[0] if len(required) == 1 else None)
        self.role = options.get("observation_role") or "user"
        self.system_prompt = options.get("system_prompt")
        self.template = options.get("prompt_template") or "{question}"

    async def reset(self, row: dict[str, Any]) -> list[Message]:
        accepted = inspect.signature(self.env.reset).parameters
        kwargs = {k: v for k, v in (("seed", row.get("seed")), ("episode_id", row.get("id"))) if k in accepted}
        obs = await self.env.reset_async(**kwargs)
        parts = [self.template.replace("{question}", str(row["question"]))] if row.get("question") else []
        parts.append(render(obs))
        opening = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return opening + [{"role": "user", "content": "\n\n".join(p for p in parts if p)}]

    def _action(self, text: str) -> Any:
        try:
            fields = json.loads(text)
        except ValueError:
            fields = None
        if not isinstance(fields, dict):
            if self.field is None:
                raise ValueError(f"{self.action_type.__name__} takes JSON fields: set agent.options.action_field")
            fields = {self.field: text}
        return self.action_type(**fields)

    async def step(self, action: str) -> StepResult:
        try:
            act = self._action(action.strip())
        except Exception as err:  # noqa: BLE001 - pydantic's ValidationError and ours: the model reads it
            message = f"error: not a valid {self.action_type.__name__}: {_why(err)}"
            return StepResult([{"role": self.role, "content": message}], info={"parse_errors": 1})
        obs = await self.env.step_async(act)
        observation = [] if obs.done else [{"role": self.role, "content": render(obs)}]
        return StepResult(observation, float(obs.reward or 0.0), bool(obs.done), {"parse_errors": 0})


@ENVIRONMENTS.register("openenv")
def openenv_env(options: dict[str, Any]) -> OpenEnvAdapter:
    """A new instance of ``options["env"]`` (with ``env_kwargs``) behind the adapter."""
    if not options.get("env") or not options.get("action"):
        raise ValueError("agent.env 'openenv' needs agent.options.env and .action, each 'package.module:Class'")
    env = resolve_ref(options["env"], {}, "agent.options.env")(**options.get("env_kwargs", {}))
    return OpenEnvAdapter(env, resolve_ref(options["action"], {}, "agent.options.action"), options)
