"""A multi-turn episode as token ids, and the tokens of the messages between the model's turns.

Tokens in, tokens out: the opening messages are templated once (``prompt_ids``); each model turn
appends the ids the engine sampled, unchanged; each observation appends its own templated
tokens (``observation_ids``). Earlier turns are never re-tokenized, so the learner trains exactly
the ids that were sampled, with their behaviour log-probs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from raypost.agents.env import Message

_PROBE = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]


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
    transcript: list[Message] = field(default_factory=list)

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


def _ids(tok: Any, messages: list[Message], generation_prompt: bool) -> list[int]:
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
    return list(tok(text, add_special_tokens=False)["input_ids"])


def prompt_ids(tok: Any, messages: list[Message]) -> list[int]:
    """The opening messages, templated, with the assistant header the model continues from."""
    return _ids(tok, messages, True)


def observation_ids(tok: Any, messages: list[Message]) -> list[int]:
    """The tokens that follow a model turn closed by EOS: the template's tail of that turn (e.g.
    ChatML's newline after ``<|im_end|>``), ``messages`` and the next assistant header. Found as
    the difference of two renderings of a probe conversation, so it holds for any template that
    renders earlier turns the same whatever follows them."""
    base = _ids(tok, _PROBE, False)
    full = _ids(tok, _PROBE + messages, True)
    if full[: len(base)] != base:
        raise ValueError("the chat template renders earlier turns differently once more follow: can't append turns")
    eos = tok.eos_token_id
    end = max(i for i, t in enumerate(base) if t == eos) if eos in base else len(base) - 1
    return base[end + 1 :] + full[len(base) :]
