"""Held-out accuracy of an agent: one greedy episode per row, with the environment and its tools,
through the rollout replicas; the last turn's answer is checked against the gold one."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from raypost.agents.actors import EnvPool
from raypost.agents.loop import Limits, run_episodes
from raypost.config.agent import AgentConfig
from raypost.rewards.verifiers import answers_match


async def _episodes(
    client: Any, pool: EnvPool, tok: Any, rows: Sequence[dict], limits: Limits, batch: int, concurrency: int
) -> list[Any]:
    gate = asyncio.Semaphore(max(1, concurrency // batch))  # batches at once

    async def generate(ids: list[list[int]], max_tokens: int) -> list[tuple[dict[str, Any], int]]:
        outs = await client.agenerate(ids, 1, {"temperature": 0.0, "max_tokens": max_tokens}, chunk=len(ids))
        return [(o["completions"][0], o["version"]) for o in outs]

    async def one(part: list[dict]) -> list[Any]:
        async with gate:
            envs = pool.envs()
            try:
                return await run_episodes(envs, part, tok, generate, limits)
            finally:
                envs.close()

    parts = await asyncio.gather(*[one(list(rows[i : i + batch])) for i in range(0, len(rows), batch)])
    return [e for part in parts for e in part]


def agent_accuracy(
    client: Any,
    tok: Any,
    rows: Sequence[dict[str, Any]],
    agent: AgentConfig,
    limits: Limits,
    options: dict[str, Any] | None = None,
    extract: str = "strict",
    keep_samples: int = 3,
    batch: int = 8,
    concurrency: int = 32,
) -> dict[str, Any]:
    """Accuracy, and per episode: turns, tool calls, the share that ended on a parse error;
    ``options``: the environment factory's (default ``agent.env_options(None)``); ``batch`` rows
    per lockstep batch of episodes, ``concurrency`` episodes at once."""
    pool = EnvPool.for_agent(agent, options if options is not None else agent.env_options(None))
    try:
        eps = asyncio.run(_episodes(client, pool, tok, rows, limits, batch, concurrency))
    finally:
        pool.shutdown()
    verdicts = [
        answers_match(e.answer, r["answer"], extract) if e.finish == "answer" else False for e, r in zip(eps, rows)
    ]
    hits = [bool(v) for v in verdicts]
    n = max(1, len(eps))
    return {
        "accuracy": sum(hits) / n,
        "n": len(eps),
        "unverified": verdicts.count(None),
        "turns": sum(e.turns for e in eps) / n,
        "tool_calls": sum(e.tool_calls for e in eps) / n,
        "parse_error_end_frac": sum(e.last_parse_error for e in eps) / n,
        "finish": {f: sum(e.finish == f for e in eps) for f in sorted({e.finish for e in eps})},
        "samples": [
            {"answer": r["answer"], "transcript": e.transcript[1:], "correct": h}
            for e, r, h in list(zip(eps, rows, hits))[:keep_samples]
        ],
    }
