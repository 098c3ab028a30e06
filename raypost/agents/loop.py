"""The agent loop: one episode, tokens in and tokens out, turn by turn.

Each model turn is one request to the rollout app with the episode's ids so far; its sampled ids
and behaviour log-probs are appended unchanged (mask 1). The environment answers the turn's
text; its observation messages are templated and appended (mask 0). The episode ends when the
environment says so (the model answered), when a turn hits its token cap or ends without EOS,
or at ``max_turns`` or ``max_tokens``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from raypost.agents.env import Environment, StepResult
from raypost.agents.episode import Episode, observation_ids, prompt_ids

# (episode ids so far, max new tokens) -> (one completion: token_ids, logprobs, text, finish_reason; weight version)
Generate = Callable[[list[int], int], Awaitable[tuple[dict[str, Any], int]]]


@dataclass(frozen=True)
class Limits:
    max_turns: int  # model turns
    max_tokens: int  # tokens after the prompt: model turns and observations
    max_turn_tokens: int  # new tokens per model turn
    max_model_len: int  # prompt + episode, the engine's context


async def run_episode(env: Environment, row: dict[str, Any], tok: Any, generate: Generate, limits: Limits) -> Episode:
    """One episode of ``env`` on ``row``; ``tok``: the policy's tokenizer (its chat template)."""
    opening = await env.reset(row)
    ep = Episode(prompt_ids(tok, opening), transcript=list(opening))
    while True:
        room = min(limits.max_turn_tokens, limits.max_tokens - len(ep.ids), limits.max_model_len - len(ep.all_ids))
        if room <= 0:
            ep.finish = "max_tokens"
            return ep
        turn, version = await generate(ep.all_ids, room)
        ep.add_model(list(turn["token_ids"]), list(turn["logprobs"]), version)
        ep.answer = turn["text"]
        ep.transcript.append({"role": "assistant", "content": turn["text"]})
        if not turn["token_ids"] or turn["token_ids"][-1] != tok.eos_token_id:
            ep.finish = "length"  # cut off mid-turn: nothing can follow it
            return ep
        result = await env.step(turn["text"])
        _count(ep, result)
        if result.done:
            ep.finish = "answer"
            return ep
        if ep.turns >= limits.max_turns:
            ep.finish = "max_turns"
            return ep
        obs = observation_ids(tok, result.observation)
        if len(ep.ids) + len(obs) >= limits.max_tokens or len(ep.all_ids) + len(obs) >= limits.max_model_len:
            ep.finish = "max_tokens"
            return ep
        ep.add_observation(obs)
        ep.transcript += result.observation


def _count(ep: Episode, result: StepResult) -> None:
    errors = int(result.info.get("parse_errors", 0))
    ep.env_reward += float(result.reward)
    ep.tool_calls += int(result.info.get("tool_calls", 0))
    ep.parse_errors += errors
    ep.last_parse_error = errors > 0
