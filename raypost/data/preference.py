"""Preference pairs for reward-model training, prepared with Ray Data.

Two ways in:
- given pairs: rows with a prompt, a chosen and a rejected response (TRL's preference format:
  strings, or chat messages ``[{"role": ..., "content": ...}]``);
- pairs built from question/answer rows (GSM8K, the synthetic task). For each question,
  chosen = its reference solution; rejected = either the same solution with a wrong final
  ``#### n`` (the worked lines are kept, so the last line and the final answer disagree), or
  the reference solution of another question with a different answer ("mismatched").
  Which one is drawn per row from a seeded RNG (``mismatch_fraction``).

Pair rows: ``id``, ``prompt``, ``chosen``, ``rejected``, ``kind``, ``reject``, ``raw``, ``where``.
"""

from __future__ import annotations

import random
import re
from typing import Any

import pandas as pd

from raypost.data.rows import RowSchema, reject, row_id
from raypost.data.tokenize import keep_raw

PAIR_COLUMNS = ["id", "prompt", "chosen", "rejected", "kind", "reject", "raw", "where"]
_FINAL = re.compile(r"####\s*(-?[\d,]*\.?\d+)\s*$")


def message_text(value: Any, role: str | None = None) -> str | None:
    """A string as is; chat messages as the content of the last message (of ``role`` if given)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(m, dict) and "content" in m for m in value):
        picked = [m for m in value if role is None or m.get("role") == role] or value
        content = picked[-1]["content"]
        return content if isinstance(content, str) else None
    return None


def normalize_pair(row: Any, prompt_field: str, chosen_field: str, rejected_field: str) -> dict[str, str]:
    """One preference row -> pair row, or a reject naming the field."""
    import json

    raw = json.dumps(row, default=str)[:2000] if isinstance(row, dict) else repr(row)[:2000]
    if not isinstance(row, dict):
        return reject(f"row is {type(row).__name__}, expected an object", raw, PAIR_COLUMNS)
    texts = {}
    for field, role in ((prompt_field, "user"), (chosen_field, "assistant"), (rejected_field, "assistant")):
        if row.get(field) is None:
            return reject(f"missing field '{field}'", raw, PAIR_COLUMNS)
        text = message_text(row[field], role)
        if text is None or not text.strip():
            return reject(f"field '{field}' must be a non-empty string or chat messages", raw, PAIR_COLUMNS)
        texts[field] = text.strip()
    if texts[chosen_field] == texts[rejected_field]:
        return reject(f"fields '{chosen_field}' and '{rejected_field}' are identical", raw, PAIR_COLUMNS)
    rid = str(row.get("id", "")) or row_id(texts[prompt_field], texts[chosen_field])
    return {
        "id": rid,
        "prompt": texts[prompt_field],
        "chosen": texts[chosen_field],
        "rejected": texts[rejected_field],
        "kind": "given",
        "reject": "",
        "raw": "",
        "where": "",
    }


def pair_schema(prompt_field: str, chosen_field: str, rejected_field: str) -> RowSchema:
    from functools import partial

    return RowSchema(
        PAIR_COLUMNS,
        partial(normalize_pair, prompt_field=prompt_field, chosen_field=chosen_field, rejected_field=rejected_field),
    )


def wrong_final(solution: str, answer: str, rng: random.Random) -> str:
    """``solution`` with its ``#### n`` replaced by a different integer near n."""
    value = int(float(answer)) if re.fullmatch(r"-?\d+(\.0+)?", answer) else 0
    wrong = value + rng.choice([d for d in range(-10, 11) if d])
    return _FINAL.sub(f"#### {wrong}", solution.rstrip())


def _other_solution(rows: list[dict], i: int, rng: random.Random, tries: int = 20) -> str | None:
    """The solution of a random other row whose answer differs from row i's (None if none found)."""
    for _ in range(tries if len(rows) > 1 else 0):
        j = rng.randrange(len(rows))
        if rows[j]["answer"] != rows[i]["answer"]:
            return rows[j]["solution"]
    return None


def build_pairs(batch: pd.DataFrame, mismatch_fraction: float, seed: int) -> pd.DataFrame:
    """Question/answer rows (``rows.COLUMNS``) -> pair rows; rejects pass through."""
    records = batch.to_dict(orient="records")
    good = [r for r in records if not r["reject"]]
    out = []
    for i, row in enumerate(good):
        rng = random.Random(f"{seed}:{row['id']}")
        other = _other_solution(good, i, rng) if rng.random() < mismatch_fraction else None
        if other is not None:
            rejected, kind = other, "mismatched"
        else:
            rejected, kind = wrong_final(row["solution"], row["answer"], rng), "wrong_answer"
        out.append(
            {
                "id": row["id"],
                "prompt": row["question"],
                "chosen": row["solution"],
                "rejected": rejected,
                "kind": kind,
                "reject": "",
                "raw": "",
                "where": row["where"],
            }
        )
    out += [reject(r["reject"], r["raw"], PAIR_COLUMNS, r["where"]) for r in records if r["reject"]]
    return pd.DataFrame(out, columns=PAIR_COLUMNS)


class TokenizePairs:
    """Ray Data UDF: encode (prompt, chosen) and (prompt, rejected) as the tokenizer's text
    pair, exactly as the reward service scores them. Over-long pairs become rejects."""

    def __init__(self, tokenizer_path: str, max_seq_len: int) -> None:
        from transformers import AutoTokenizer

        from raypost.models.named import resolve

        self.tok = AutoTokenizer.from_pretrained(resolve(tokenizer_path))
        self.max_seq_len = max_seq_len

    def _encode(self, prompts: list[str], responses: list[str]) -> tuple[list[list[int]], list[list[int]]]:
        enc = self.tok(prompts, responses, truncation=False)
        ids = [list(x) for x in enc["input_ids"]]
        types = [list(x) for x in enc["token_type_ids"]] if "token_type_ids" in enc else [[] for _ in ids]
        return ids, types

    def __call__(self, batch: pd.DataFrame) -> pd.DataFrame:
        ok = (batch["reject"] == "").tolist()
        prompts = [p if g else "" for p, g in zip(batch["prompt"], ok)]
        c_ids, c_tt = self._encode(prompts, [c if g else "" for c, g in zip(batch["chosen"], ok)])
        r_ids, r_tt = self._encode(prompts, [r if g else "" for r, g in zip(batch["rejected"], ok)])
        rejects = batch["reject"].tolist()
        for i, good in enumerate(ok):
            longest = max(len(c_ids[i]), len(r_ids[i]))
            if good and longest > self.max_seq_len:
                rejects[i] = f"too long: {longest} tokens > data.max_seq_len {self.max_seq_len}"
        return batch.assign(
            reject=rejects,
            chosen_ids=c_ids,
            chosen_types=c_tt,
            rejected_ids=r_ids,
            rejected_types=r_tt,
            raw=keep_raw(batch, rejects, ["id", "prompt", "chosen", "rejected"]),
        )


class TokenizeChatPairs:
    """Ray Data UDF for a causal LM's preference learner (DPO): the prompt through the chat
    template (as SFT and GRPO build it), each response closed by EOS. Columns ``prompt_ids``,
    ``chosen_ids`` and ``rejected_ids`` (responses only). Over-long pairs become rejects."""

    def __init__(self, tokenizer_path: str, max_seq_len: int, system_prompt: str | None, template: str) -> None:
        from raypost.models.hf import load_tokenizer

        self.tok, self.max_seq_len = load_tokenizer(tokenizer_path), max_seq_len
        self.system_prompt, self.template = system_prompt, template

    def __call__(self, batch: pd.DataFrame) -> pd.DataFrame:
        from raypost.data.tokenize import completion_ids, prompt_ids

        rejects, prompts, chosen, rejected = batch["reject"].tolist(), [], [], []
        for i, row in enumerate(batch.itertuples(index=False)):
            good = not rejects[i]
            p = prompt_ids(self.tok, row.prompt, self.system_prompt, self.template) if good else []
            c = completion_ids(self.tok, row.chosen) if good else []
            r = completion_ids(self.tok, row.rejected) if good else []
            longest = len(p) + max(len(c), len(r))
            if good and longest > self.max_seq_len:
                rejects[i] = f"too long: {longest} tokens > data.max_seq_len {self.max_seq_len}"
            prompts.append(p)
            chosen.append(c)
            rejected.append(r)
        return batch.assign(
            reject=rejects,
            prompt_ids=prompts,
            chosen_ids=chosen,
            rejected_ids=rejected,
            raw=keep_raw(batch, rejects, ["id", "prompt", "chosen", "rejected"]),
        )


def best_worst(rewards: list[float], min_margin: float) -> tuple[int, int] | None:
    """On-policy pairs: the indices (chosen, rejected) of a question's samples with the highest
    and the lowest reward (the first of ties); None unless the gap exceeds ``min_margin``."""
    if not rewards:
        raise ValueError("a pair needs at least one sample")
    hi = max(range(len(rewards)), key=rewards.__getitem__)
    lo = min(range(len(rewards)), key=rewards.__getitem__)
    return (hi, lo) if rewards[hi] - rewards[lo] > min_margin else None


def ranked_pairs(rewards: list[float], ids: list[list[int]], min_margin: float, n: int) -> list[tuple[int, int]]:
    """Up to ``n`` (chosen, rejected) index pairs of one question's samples: each distinct
    rejected completion (by token ids), worst reward first (first of ties), whose reward is more
    than ``min_margin`` below the best, paired in turn with the distinct best-reward completions.
    ``n`` 1 is ``best_worst``'s pair; none where every low sample repeats a best one's tokens."""
    best = max(rewards)
    chosen: dict[tuple[int, ...], int] = {}
    for i, r in enumerate(rewards):
        if r == best:
            chosen.setdefault(tuple(ids[i]), i)
    rejected: dict[tuple[int, ...], int] = {}
    for i in sorted(range(len(rewards)), key=lambda i: (rewards[i], i)):
        key = tuple(ids[i])
        if best - rewards[i] > min_margin and key not in chosen:
            rejected.setdefault(key, i)
    tops = list(chosen.values())
    return [(tops[j % len(tops)], r) for j, r in enumerate(list(rejected.values())[:n])]


def policy_pairs(
    scored: list[dict[str, Any]], min_margin: float, max_seq_len: int, per_question: int = 1
) -> tuple[list[dict], dict]:
    """Sampled questions (``phases.passrate.sample``'s rows, with ``question``) -> pair rows of
    token ids as sampled (``prompt_ids``, ``chosen_ids``, ``rejected_ids``, with their texts and
    rewards), at most ``per_question`` a question (``ranked_pairs``; the id of the j-th after the
    first is ``<id>#<j>``), and the count of each reason a question or pair was dropped."""
    pairs, dropped = [], {"no_margin": 0, "identical": 0, "too_long": 0}
    for row in scored:
        if best_worst(row["rewards"], min_margin) is None:
            dropped["no_margin"] += 1
            continue
        picked = ranked_pairs(row["rewards"], row["completion_ids"], min_margin, per_question)
        dropped["identical"] += int(not picked)
        for j, (c, r) in enumerate(picked):
            c_ids, r_ids = row["completion_ids"][c], row["completion_ids"][r]
            if len(row["prompt_ids"]) + max(len(c_ids), len(r_ids)) > max_seq_len:
                dropped["too_long"] += 1
                continue
            pairs.append(
                {
                    "id": row["id"] if j == 0 else f"{row['id']}#{j}",
                    "prompt": row["question"],
                    "chosen": row["completions"][c],
                    "rejected": row["completions"][r],
                    "chosen_reward": row["rewards"][c],
                    "rejected_reward": row["rewards"][r],
                    "prompt_ids": row["prompt_ids"],
                    "chosen_ids": c_ids,
                    "rejected_ids": r_ids,
                }
            )
    return pairs, dropped
