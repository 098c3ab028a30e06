"""The agent loop: a batch of episodes, tokens in and tokens out, turn by turn.

The episodes of a batch (a GRPO group, or a slice of the held-out set) move in lockstep: each
turn, the live episodes' ids go to the rollout app in one request per distinct token budget, and
their texts to the environment host in one call; the sampled ids and behaviour log-probs are
appended unchanged (mask 1), each observation is templated and appended (mask 0). An episode ends
when its environment says so (the model answered), when a turn hits its token cap or ends without
EOS, or at ``max_turns`` or ``max_tokens``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from raypost.agents.env import EnvBatch, StepResult
from raypost.agents.episode import Episode, observation_ids, prompt_ids

# (each episode's ids so far, max new tokens) -> per episode: (one completion: token_ids,
# logprobs, text, finish_reason; the weight version that sampled it)
Generate = Callable[[list[list[int]], int], Awaitable[list[tuple[dict[str, Any], int]]]]


@dataclass(frozen=True)
class Limits:
    max_turns: int  # model turns
    max_tokens: int  # tokens after the prompt: model turns and observations
    max_turn_tokens: int  # new tokens per model turn
    max_model_len: int  # prompt + episode, the engine's context


async def run_episodes(
    envs: EnvBatch, rows: list[dict[str, Any]], tok: Any, generate: Generate, limits: Limits
) -> list[Episode]:
    """One episode per row, episode i on ``envs``' environment i; ``tok``: the policy's tokenizer."""
    openings = await envs.reset(rows)
    rendered: dict[str, list[int]] = {}  # a group's G openings are templated once
    eps = []
    for opening in openings:
        key = json.dumps(opening, sort_keys=True)
        rendered.setdefault(key, prompt_ids(tok, opening))
        eps.append(Episode(list(rendered[key]), transcript=list(opening)))
    live = list(range(len(eps)))
    while live:
        live = await _model_turn(eps, live, tok.eos_token_id, generate, limits)
        if live:
            live = _env_turn(eps, live, await envs.step({i: eps[i].answer for i in live}), tok, limits)
    return eps


async def _model_turn(eps: list[Episode], live: list[int], eos: int, generate: Generate, limits: Limits) -> list[int]:
    """Sample the next turn of every live episode; the ones that may go on to the environment."""
    by_room: dict[int, list[int]] = {}
    for i in live:
        ep = eps[i]
        room = min(limits.max_turn_tokens, limits.max_tokens - len(ep.ids), limits.max_model_len - len(ep.all_ids))
        if room <= 0:
            ep.finish = "max_tokens"
        else:
            by_room.setdefault(room, []).append(i)
    rooms = list(by_room)
    outs = await asyncio.gather(*[generate([eps[i].all_ids for i in by_room[r]], r) for r in rooms])
    going = []
    for room, turns in zip(rooms, outs):
        for i, (turn, version) in zip(by_room[room], turns):
            ep = eps[i]
            ep.add_model(list(turn["token_ids"]), list(turn["logprobs"]), version)
            ep.answer = turn["text"]
            ep.transcript.append({"role": "assistant", "content": turn["text"]})
            if turn["token_ids"] and turn["token_ids"][-1] == eos:
                going.append(i)
            else:
                ep.finish = "length"  # cut off mid-turn: nothing can follow it
    return sorted(going)


def _env_turn(
    eps: list[Episode], live: list[int], results: dict[int, StepResult], tok: Any, limits: Limits
) -> list[int]:
    """Append each environment's answer; the episodes that go on to another model turn."""
    going = []
    for i in live:
        ep, result = eps[i], results[i]
        _count(ep, result)
        if result.done:
            ep.finish = "answer"
        elif ep.turns >= limits.max_turns:
            ep.finish = "max_turns"
        else:
            obs = observation_ids(tok, result.observation)
            if len(ep.ids) + len(obs) >= limits.max_tokens or len(ep.all_ids) + len(obs) >= limits.max_model_len:
                ep.finish = "max_tokens"
            else:
                ep.add_observation(obs)
                ep.transcript += result.observation
                going.append(i)
    return going


def _count(ep: Episode, result: StepResult) -> None:
    errors = int(result.info.get("parse_errors", 0))
    ep.env_reward += float(result.reward)
    ep.tool_calls += int(result.info.get("tool_calls", 0))
    ep.parse_errors += errors
    ep.last_parse_error = errors > 0
