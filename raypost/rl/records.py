"""Typed records of the RL learners (as torchtune's ``GRPOTrajectory``): what a sampled
sequence carries from the rollout side to the learner's step.

Lengths: P prompt tokens, C completion tokens, k the teacher's top-k width.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Sequence:
    """One sampled sequence as a learner trains it: prompt + completion, with what the loss needs."""

    ids: list[int]  # [P + C] prompt token ids, then completion token ids
    start: int  # P: the index of the first completion token
    old: list[float]  # [C] behaviour log-probs: the sampler's, of each completion token
    sample_id: str  # "<prompt row id>#<sample index>": the key of the trained-samples record
    adv: float = 0.0  # the sequence's advantage (GRPO family); 0 where the loss is per token
    train: bool = True  # in the loss (False: filtered out, e.g. an overlong completion)
    version: int = 0  # the weight version that sampled it
    stale: int = 0  # the learner's version minus ``version`` when it trains (0: on-policy)
    teacher: list[float] | None = None  # [C] the teacher's log-probs of the sampled tokens (distillation)
    top_ids: list[int] | None = None  # [C * k] the teacher's top-k token ids per position, row-major
    top_logprobs: list[float] | None = None  # [C * k] their log-probs
    correct: bool | None = None  # the completion's final answer checked against the gold one

    @property
    def completion_len(self) -> int:
        """C: completion tokens."""
        return len(self.ids) - self.start

    @property
    def loss_tokens(self) -> int:
        """The completion tokens ``collate`` puts in the loss mask: C, or 0 when not trained."""
        return self.completion_len if self.train and self.completion_len > 0 else 0
