"""A multi-turn episode as token ids, and the tokens of the messages between the model's turns.

Tokens in, tokens out: the opening messages are templated once (``prompt_ids``); each model turn
appends the ids the engine sampled, unchanged; each observation appends its own templated
tokens (``observation_ids``). Earlier turns are never re-tokenized, so the learner trains exactly
the ids that were sampled, with their behaviour log-probs.
"""

from __future__ import annotations

from typing import Any

from raypost.agents.env import Message
from raypost.rl.episode import Episode

__all__ = ["Episode", "observation_ids", "prompt_ids"]

_PROBE = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]


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
