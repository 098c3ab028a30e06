"""Multi-turn rollout throughput against single-turn, at equal model tokens, on one rollout app.

Single-turn is the GRPO producer's path: one request per group, n = G completions of L tokens.
Multi-turn is the agent loop's: G episodes per group, in lockstep, each K turns of L/K tokens;
every turn one request with the group's episodes' ids so far, and one call to an environment actor
answering each episode with an observation (``fixed_turns`` below) that is templated and appended.
Both count the tokens the model sampled (observations excluded). The tiny random model rarely emits EOS, so turns run to
their cap; the harness closes each turn with EOS (its last sampled id replaced), as a model that
ends its turns would. Rounds alternate (single, multi, single, ...) after a warm-up round of each;
figures are medians.

    .venv/bin/python -m benchmarks.agent_rollout [--shape tiny] [--groups 8] [--g 8] [--tokens 128] [--turns 4]
        [--block-size 32]

Prints a table and writes benchmarks/out/agent_rollout_<shape>[_block<n>].json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from typing import Any

from benchmarks.common import OUT, model_for, table
from raypost.agents import StepResult

OBSERVATION = "The tool says: 42. Go on."


class FixedTurns:
    """Answers every turn with ``OBSERVATION`` until the episode's turn cap ends it."""

    async def reset(self, row: dict[str, Any]) -> list[dict[str, str]]:
        return [{"role": "user", "content": row["question"]}]

    async def step(self, action: str) -> StepResult:
        return StepResult([{"role": "tool", "content": OBSERVATION}], info={"tool_calls": 1})


def fixed_turns(options: dict[str, Any]) -> FixedTurns:
    return FixedTurns()


def single_round(client: Any, prompts: list[list[int]], g: int, tokens: int) -> int:
    outs = asyncio.run(client.agenerate(prompts, g, {"temperature": 1.0, "max_tokens": tokens}))
    return sum(len(c["token_ids"]) for o in outs for c in o["completions"])


def multi_round(client: Any, pool: Any, tok: Any, questions: list[str], g: int, tokens: int, turns: int) -> int:
    from raypost.agents import AgentRollout
    from raypost.config.agent import AgentConfig
    from raypost.config.grpo import AlgoConfig

    class Closed(AgentRollout):  # the producer's requests, each turn closed with EOS
        async def _generate(self, batch: list[list[int]], max_tokens: int) -> list[tuple[dict[str, Any], int]]:
            turns = await super()._generate(batch, max_tokens)
            return [({**c, "token_ids": [*c["token_ids"][:-1], tok.eos_token_id]}, v) for c, v in turns]

    agent = AgentConfig(env="benchmarks.agent_rollout:fixed_turns", max_turns=turns, max_episode_tokens=100_000)
    algo = AlgoConfig(group_size=g, max_new_tokens=tokens // turns, temperature=1.0)
    roll = Closed(client, pool, tok, agent, algo, 512)

    async def group(q: str) -> int:  # the GRPO producer's way: a group's G episodes in lockstep
        eps = await roll.episodes({"id": q, "question": q})
        return sum(sum(ep.mask) for ep in eps)

    async def all_() -> list[int]:
        return await asyncio.gather(*[group(q) for q in questions])

    return sum(asyncio.run(all_()))


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import ray
    from ray import serve

    from raypost.agents import EnvPool
    from raypost.config import build
    from raypost.config.serve import RolloutConfig
    from raypost.data import prompt_ids, synthetic
    from raypost.models.hf import load_tokenizer
    from raypost.serve.rollout_app import build_app
    from raypost.serve.rollout_client import RolloutClient

    model = model_for(args.shape)
    tok = load_tokenizer(model)
    questions = [r["question"] for r in synthetic.generate(args.groups, seed=99)]
    prompts = [prompt_ids(tok, q, None) for q in questions]
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    engine = {"num_replicas": 1, "cpus_per_replica": 1, "max_model_len": 512, "block_size": args.block_size}
    cfg = build(RolloutConfig, engine)
    serve.run(build_app(str(model), cfg), name="rollout", route_prefix=None)
    client = RolloutClient("rollout", chunk=1)
    pool = EnvPool("benchmarks.agent_rollout:fixed_turns", {}, 2, 0.05, timeout_s=60)
    rates: dict[str, list[float]] = {"single": [], "multi": []}
    rounds = {
        "single": lambda: single_round(client, prompts, args.g, args.tokens),
        "multi": lambda: multi_round(client, pool, tok, questions, args.g, args.tokens, args.turns),
    }
    try:
        for r in range(args.repeats + 1):
            for name, fn in rounds.items():
                t0 = time.perf_counter()
                n = fn()
                if r:  # round 0 warms up
                    rates[name].append(n / (time.perf_counter() - t0))
    finally:
        pool.shutdown()
        serve.shutdown()
        ray.shutdown()
    return rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=["tiny", "100m"], default="tiny")
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--g", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128, help="model tokens per sample (episode)")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--block-size", type=int, default=None, help="rollout.block_size (None: vLLM's)")
    args = ap.parse_args()
    load = os.getloadavg()[0]
    rates = measure(args)
    single, multi = statistics.median(rates["single"]), statistics.median(rates["multi"])
    print(
        table(
            f"\nrollout tokens/s, model {args.shape}, {args.groups} groups x G={args.g}, {args.tokens} model tokens a "
            f"sample; multi-turn: {args.turns} turns; median of {args.repeats}; load before start {load:.2f}",
            ["variant", "model tok/s", "vs single-turn"],
            [
                ["single-turn (n=G per request)", f"{single:.0f}", "1.00"],
                [f"{args.turns}-turn episodes", f"{multi:.0f}", f"{multi / single:.2f}"],
            ],
        )
    )
    OUT.mkdir(parents=True, exist_ok=True)
    out = {
        "args": vars(args),
        "tokens_per_s": rates,
        "median": {"single": single, "multi": multi},
        "ratio": multi / single,
    }
    suffix = f"_block{args.block_size}" if args.block_size else ""
    (OUT / f"agent_rollout_{args.shape}{suffix}.json").write_text(json.dumps({**out, "load_before": load}, indent=2))


if __name__ == "__main__":
    main()
