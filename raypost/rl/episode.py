"""A multi-turn episode as one token sequence: the record the agent loop builds and the learner
trains (model tokens masked in, observations out), and that a recorded external session becomes
(``raypost.serve.sessions``)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Episode:
    """One episode. C: the tokens after the prompt (model turns and observations)."""

    prompt_ids: list[int]  # [P] the templated opening messages, ending with the assistant header
    ids: list[int] = field(default_factory=list)  # [C] every token after the prompt
    mask: list[int] = field(default_factory=list)  # [C] 1 on the model's own tokens (trained), 0 on observations
    logprobs: list[float] = field(default_factory=list)  # [C] behaviour log-probs; 0.0 on observations
    version: int = -1  # the oldest weight version among the model's turns
    turns: int = 0  # model turns
    tool_calls: int = 0
    parse_errors: int = 0
    last_parse_error: bool = False  # the last observation answered an unreadable or unknown tool call
    env_reward: float = 0.0  # the sum of the environment's per-turn rewards
    finish: str = ""  # answer | env_done | length (a turn hit its token cap) | max_turns | max_tokens
    answer: str = ""  # the last model turn's text: what the reward service scores
    transcript: list[dict[str, str]] = field(default_factory=list)  # the chat messages

    def add_model(self, ids: list[int], logprobs: list[float], version: int) -> None:
        self.ids += ids
        self.mask += [1] * len(ids)
        self.logprobs += list(logprobs[: len(ids)]) + [0.0] * (len(ids) - len(logprobs))
        self.version = version if self.version < 0 else min(self.version, version)
        self.turns += 1

    def add_observation(self, ids: list[int]) -> None:
        self.ids += ids
        self.mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.ids
