"""Environments in Ray actors: a pool of hosts, each running many batches of episodes at once.

An environment is named by a registered name (``raypost.agents.ENVIRONMENTS``) or an import path
``package.module:factory``; ``factory(options)`` builds one episode's environment inside the host
actor. A batch (a GRPO group) lives on one host and takes one actor call per turn. Hosts restart
when they die (``max_restarts=-1``); the batches they held are lost, and the caller retries them
from the start (``raypost.agents.rollout``). Every call is bounded by
``timeout_s``.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from dataclasses import asdict
from typing import Any

from raypost.agents.env import ENVIRONMENTS, LocalEnvs, Message, StepResult
from raypost.config.agent import AgentConfig
from raypost.utils.refs import resolve_ref


class EpisodeLostError(RuntimeError):
    """The host no longer holds this episode: it restarted after a crash. Retry the episode."""


def env_factory(ref: str) -> Any:
    """A registered environment name, or ``package.module:factory``."""
    import raypost.agents.calculator_env  # noqa: F401 - registers the built-in environments
    import raypost.agents.openenv_env  # noqa: F401

    return resolve_ref(ref, ENVIRONMENTS, "environment")


class EnvHost:
    """A Ray actor (async: its batches interleave) holding batches of episodes by id."""

    def __init__(self, ref: str, options: dict[str, Any]) -> None:
        self.factory, self.options = env_factory(ref), options
        self.batches: dict[str, LocalEnvs] = {}

    async def reset(self, bid: str, rows: list[dict[str, Any]]) -> list[list[Message]]:
        envs = LocalEnvs([self.factory(self.options) for _ in rows])
        self.batches[bid] = envs
        return await envs.reset(rows)

    async def step(self, bid: str, actions: dict[int, str]) -> dict[int, dict[str, Any]]:
        envs = self.batches.get(bid)
        if envs is None:
            raise EpisodeLostError(f"episodes {bid} are not on this environment host (it restarted)")
        return {i: asdict(r) for i, r in (await envs.step(actions)).items()}

    def close(self, bid: str) -> None:
        self.batches.pop(bid, None)

    def pid(self) -> int:
        import os

        return os.getpid()


class RemoteEnvs:
    """A batch of episodes on one host actor, as an ``EnvBatch``: one actor call per turn."""

    def __init__(self, host: Any, timeout_s: float) -> None:
        self.host, self.timeout_s, self.bid = host, timeout_s, uuid.uuid4().hex

    async def reset(self, rows: list[dict[str, Any]]) -> list[list[Message]]:
        return await asyncio.wait_for(self.host.reset.remote(self.bid, rows), self.timeout_s)

    async def step(self, actions: dict[int, str]) -> dict[int, StepResult]:
        out = await asyncio.wait_for(self.host.step.remote(self.bid, actions), self.timeout_s)
        return {i: StepResult(**r) for i, r in out.items()}

    def close(self) -> None:
        self.host.close.remote(self.bid)  # fire and forget: a dead host holds nothing


class EnvPool:
    """``size`` host actors of environment ``ref``, ``cpus`` each; episodes go round-robin."""

    def __init__(self, ref: str, options: dict[str, Any], size: int, cpus: float, timeout_s: float) -> None:
        import ray

        env_factory(ref)  # a bad name fails here, naming it, not in every actor
        actor = ray.remote(EnvHost).options(num_cpus=cpus, max_restarts=-1, max_task_retries=0)
        self.hosts = [actor.remote(ref, options) for _ in range(size)]
        self.timeout_s = timeout_s
        self._next = itertools.cycle(range(size))

    @classmethod
    def for_agent(cls, agent: AgentConfig, options: dict[str, Any]) -> EnvPool:
        """The pool ``agent`` asks for, its factories given ``options`` (``agent.env_options(...)``)."""
        return cls(agent.env, options, agent.num_env_actors, agent.cpus_per_env_actor, agent.env_timeout_s)

    def envs(self) -> RemoteEnvs:
        """A new batch of episodes on the next host."""
        return RemoteEnvs(self.hosts[next(self._next)], self.timeout_s)

    def shutdown(self) -> None:
        import ray

        for h in self.hosts:
            ray.kill(h, no_restart=True)
