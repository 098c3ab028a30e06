"""Held-out accuracy of an agent: one greedy episode per row, with the environment and its tools,
through the rollout replicas; the last turn's answer is checked against the gold one."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from raypost.agents.actors import EnvPool
from raypost.agents.loop import Limits, run_episode
from raypost.config.agent import AgentConfig
from raypost.rewards.verifiers import answers_match


async def _episodes(client: Any, pool: EnvPool, tok: Any, rows: Sequence[dict], limits: Limits, concurrency: int):
    gate = asyncio.Semaphore(concurrency)

    async def generate(ids: list[int], max_tokens: int) -> tuple[dict[str, Any], int]:
        [out] = await client.agenerate([ids], 1, {"temperature": 0.0, "max_tokens": max_tokens})
        return out["completions"][0], out["version"]

    async def one(row: dict) -> Any:
        async with gate:
            env = pool.env()
            try:
                return await run_episode(env, row, tok, generate, limits)
            finally:
                env.close()

    return await asyncio.gather(*[one(r) for r in rows])


def agent_accuracy(
    client: Any,
    tok: Any,
    rows: Sequence[dict[str, Any]],
    agent: AgentConfig,
    limits: Limits,
    options: dict[str, Any] | None = None,
    extract: str = "strict",
    keep_samples: int = 3,
    concurrency: int = 32,
) -> dict[str, Any]:
    """Accuracy, and per episode: turns, tool calls, the share that ended on a parse error;
    ``options``: the environment factory's (default ``agent.env_options(None)``)."""
    pool = EnvPool.for_agent(agent, options if options is not None else agent.env_options(None))
    try:
        eps = asyncio.run(_episodes(client, pool, tok, rows, limits, concurrency))
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
