"""Multi-turn rollouts for the GRPO producer: G episodes per prompt row, in lockstep, on one
environment host; each turn one request to the rollout app; one ``Group`` the learner trains."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from raypost.agents.actors import EnvPool
from raypost.agents.episode import Episode
from raypost.agents.loop import Limits, run_episodes
from raypost.config.agent import AgentConfig
from raypost.config.grpo import AlgoConfig
from raypost.rl.groups import Group, Sample, sampling
from raypost.serve.rollout_client import RETRYABLE

log = logging.getLogger("raypost.agents")
RETRY_EPISODE = (*RETRYABLE, "EpisodeLostError")


def _retry(err: BaseException) -> bool:
    return any(t.__name__ in RETRY_EPISODE for t in type(err).__mro__)


def to_sample(ep: Episode) -> Sample:
    """The episode as a sample; only an episode that ended on an answer has text for the reward
    service to score (the held-out evaluation counts the same): one cut off at ``max_turns`` in the
    middle of tool calls scores as an empty answer, so a model can't be paid for putting the
    result into its last tool call (SmolLM2 learned exactly that, with flexible extraction)."""
    capped = ep.finish in ("length", "max_tokens")
    return Sample(
        ep.ids,
        ep.logprobs,
        "length" if capped else "stop",
        ep.answer if ep.finish == "answer" else "",
        ep.version,
        mask=ep.mask,
        turns=ep.turns,
        tool_calls=ep.tool_calls,
        parse_error_end=ep.last_parse_error,
        env_reward=ep.env_reward,
    )


class AgentRollout:
    """``group(row)``: the producer's rollout when ``agent.env`` is set."""

    def __init__(
        self, client: Any, pool: EnvPool, tok: Any, agent: AgentConfig, algo: AlgoConfig, max_model_len: int
    ) -> None:
        self.client, self.pool, self.tok, self.agent, self.algo = client, pool, tok, agent, algo
        self.limits = Limits(agent.max_turns, agent.max_episode_tokens, algo.max_new_tokens, max_model_len)

    async def _generate(self, batch: list[list[int]], max_tokens: int) -> list[tuple[dict[str, Any], int]]:
        params = {**sampling(self.algo), "max_tokens": max_tokens}
        if all(ids == batch[0] for ids in batch):  # the first turn: one prompt, n samples, one prefill
            [out] = await self.client.agenerate(batch[:1], len(batch), params)
            return [(c, out["version"]) for c in out["completions"]]
        outs = await self.client.agenerate(batch, 1, params, chunk=len(batch))  # one request per turn
        return [(o["completions"][0], o["version"]) for o in outs]

    async def episodes(self, row: dict[str, Any]) -> list[Episode]:
        """The group's G episodes on one environment host, retried from the start while that host
        is lost (dead, restarting)."""
        for attempt in range(1, self.agent.episode_attempts + 1):
            envs = self.pool.envs()
            try:
                rows = [row] * self.algo.group_size
                return await run_episodes(envs, rows, self.tok, self._generate, self.limits)
            except Exception as err:  # noqa: BLE001 - classified
                if not _retry(err) or attempt == self.agent.episode_attempts:
                    raise
                log.warning("episodes of %s lost (%s); retry %d", row["id"], type(err).__name__, attempt)
                await asyncio.sleep(min(5.0, 0.5 * 2**attempt))
            finally:
                envs.close()
        raise AssertionError("unreachable")

    async def group(self, row: dict[str, Any]) -> Group:
        eps = await self.episodes(row)
        if any(e.prompt_ids != eps[0].prompt_ids for e in eps):
            raise ValueError(f"environment {self.agent.env!r} opened row {row['id']} differently in one group")
        samples = [to_sample(e) for e in eps]
        return Group(str(row["id"]), eps[0].prompt_ids, row["question"], row["answer"], samples)
