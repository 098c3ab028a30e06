"""Typed records of the RL learners (as torchtune's ``GRPOTrajectory``): what a sampled
sequence carries from the rollout side to the learner's step.

Lengths: P prompt tokens, C completion tokens, k the teacher's top-k width; in a batch, N
sequences and T the longest.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch


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
    mask: list[int] | None = None  # [C] multi-turn: 1 on the model's tokens, 0 on observations (None: all 1)
    reward: float = 0.0  # the sequence's scalar reward (PPO's GAE puts it on the last sampled token)
    token_adv: list[float] | None = None  # [C] PPO: per-token advantages (GAE, whitened), set by the learner
    returns: list[float] | None = None  # [C] PPO: the critic's targets, advantages + values
    values: list[float] | None = None  # [C] PPO: the critic's values before this batch's updates

    @property
    def completion_len(self) -> int:
        """C: completion tokens."""
        return len(self.ids) - self.start

    @property
    def sampled_len(self) -> int:
        """The tokens the policy sampled: C, less a multi-turn episode's observation tokens."""
        return self.completion_len if self.mask is None else sum(self.mask)

    @property
    def loss_tokens(self) -> int:
        """The completion tokens ``collate`` puts in the loss mask: C (the model's own, multi-turn),
        or 0 when not trained."""
        return self.sampled_len if self.train and self.completion_len > 0 else 0


@dataclass
class LearnerBatch:
    """Sequences collated for one micro-batch of a sampling learner's step (``rl.tensors.collate``).
    Per-token tensors are over the T-1 next-token targets: column j predicts ``input_ids[:, j+1]``."""

    input_ids: torch.Tensor  # [N, T] long, right-padded
    attention_mask: torch.Tensor  # [N, T] long: 1 on real tokens
    targets: torch.Tensor  # [N, T-1] long: input_ids[:, 1:]
    mask: torch.Tensor  # [N, T-1] float: 1 on the completion tokens the loss trains
    old_logp: torch.Tensor  # [N, T-1] float: behaviour log-probs, 0 off the completion
    adv: torch.Tensor  # [N] float: each sequence's advantage
    fresh: torch.Tensor  # [N] float: 1 for a sample of the learner's current weight version
    teacher_lp: torch.Tensor | None = None  # [N, T-1] on-policy distillation: the teacher's log-probs
    top_ids: torch.Tensor | None = None  # [N, T-1, k] long: the teacher's top-k ids
    top_lp: torch.Tensor | None = None  # [N, T-1, k] float: their log-probs
    token_adv: torch.Tensor | None = None  # [N, T-1] float PPO: per-token advantages, 0 off the completion
    returns: torch.Tensor | None = None  # [N, T-1] float PPO: the critic's targets
    old_values: torch.Tensor | None = None  # [N, T-1] float PPO: the critic's values before the update

    def to(self, device: torch.device | str) -> LearnerBatch:
        """Every tensor on ``device`` (the learner's); a no-op on CPU."""
        return dataclasses.replace(
            self,
            **{
                f.name: getattr(self, f.name).to(device, non_blocking=True)
                for f in dataclasses.fields(self)
                if getattr(self, f.name) is not None
            },
        )

    @property
    def per_token(self) -> tuple[str, ...]:
        """The fields laid out over the T-1 targets."""
        return ("targets", "mask", "old_logp", "teacher_lp", "top_ids", "top_lp", "token_adv", "returns", "old_values")
