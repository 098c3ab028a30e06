"""Chat template + tokenization with completion-only labels, as a Ray Data UDF.

The prompt is the tokenizer's own chat template applied to the question (and a multi-turn demo's
``prior_turns``), with the generation prompt appended; the completion is the solution followed by EOS. The two
are tokenized separately and concatenated, which is exactly what the model sees at
generation time (the rollout engine continues from the prompt ids).
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

IGNORE_INDEX = -100


def chat_messages(question: str, system_prompt: str | None, template: str = "{question}") -> list[dict[str, str]]:
    """The system message (if any) and the user turn: ``template`` with ``{question}`` replaced
    (plain replacement, so braces elsewhere, e.g. LaTeX, stay as written)."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return messages + [{"role": "user", "content": template.replace("{question}", question)}]


def prompt_ids(
    tokenizer: Any,
    question: str,
    system_prompt: str | None,
    template: str = "{question}",
    prior_turns: list[dict[str, str]] | None = None,
) -> list[int]:
    """Token ids of the chat-templated prompt, ending with the assistant header; ``prior_turns``:
    messages after the user turn (a multi-turn demo's earlier assistant and tool turns)."""
    messages = chat_messages(question, system_prompt, template) + list(prior_turns or [])
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def completion_ids(tokenizer: Any, solution: str) -> list[int]:
    """Token ids of the target answer, closed by the tokenizer's EOS (end of turn)."""
    return list(tokenizer(solution, add_special_tokens=False)["input_ids"]) + [tokenizer.eos_token_id]


def sft_example(prompt: list[int], completion: list[int]) -> dict[str, list[int]]:
    """input_ids = prompt + completion; labels mask the prompt with -100 (completion-only loss)."""
    return {"input_ids": prompt + completion, "labels": [IGNORE_INDEX] * len(prompt) + completion}


class Tokenize:
    """Ray Data callable class: normalized rows -> rows with ``prompt_ids`` and ``completion_ids``.

    Rows whose prompt + completion exceed ``max_seq_len`` become rejects (reason names the
    lengths and the config field to raise); nothing is dropped here.
    """

    def __init__(
        self, tokenizer_path: str, system_prompt: str | None, max_seq_len: int, prompt_template: str = "{question}"
    ) -> None:
        from transformers import AutoTokenizer

        from raypost.models.named import resolve

        self.tok = AutoTokenizer.from_pretrained(resolve(tokenizer_path))
        if self.tok.eos_token_id is None:
            raise ValueError(f"tokenizer at {tokenizer_path} has no eos_token; set one before training")
        self.system_prompt, self.prompt_template = system_prompt, prompt_template
        self.max_seq_len = max_seq_len

    def __call__(self, batch: pd.DataFrame) -> pd.DataFrame:
        prompts, completions, rejects = [], [], []
        prior = batch["prior_turns"] if "prior_turns" in batch else [""] * len(batch)
        for question, solution, turns, rej in zip(batch["question"], batch["solution"], prior, batch["reject"]):
            if rej:
                prompts.append([]), completions.append([]), rejects.append(rej)
                continue
            p = prompt_ids(self.tok, question, self.system_prompt, self.prompt_template, json.loads(turns or "[]"))
            c = completion_ids(self.tok, solution)
            if len(p) + len(c) > self.max_seq_len:
                rejects.append(
                    f"too long: {len(p)} prompt + {len(c)} answer tokens > data.max_seq_len="
                    f"{self.max_seq_len}; raise data.max_seq_len or shorten the row"
                )
                prompts.append([]), completions.append([])
                continue
            prompts.append(p), completions.append(c), rejects.append("")
        out = batch.copy()
        out["prompt_ids"], out["completion_ids"], out["reject"] = prompts, completions, rejects
        out["raw"] = keep_raw(batch, rejects, ["id", "question", "solution"])
        return out


def keep_raw(batch: pd.DataFrame, rejects: list[str], columns: list[str]) -> list[str]:
    """``raw`` for rows rejected after normalization (too long): the normalized row as JSON, so
    the rejects file says which row it was; earlier rejects keep their original raw text."""
    import json

    raws = batch["raw"].tolist()
    return [
        raw if raw or not rej else json.dumps({c: batch[c].iat[i] for c in columns})
        for i, (raw, rej) in enumerate(zip(raws, rejects))
    ]
