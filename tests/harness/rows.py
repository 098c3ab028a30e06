"""The rows every learner-equivalence case trains on (tests/harness/learner_equivalence.py) and
``benchmarks/gpu_learners.py`` steps: lengths 1-60 tokens, so short and long rows land in
different micro-batches, and a split that normalizes per micro-batch shows."""

from __future__ import annotations

import random
from typing import Any

from raypost.data.tokenize import IGNORE_INDEX
from raypost.rl.records import Sequence

K = 4  # teacher top-k width
# Completion (or supervised) lengths per row: short and long rows land in different micro-batches.
LENGTHS = [2, 3, 45, 1, 60, 4, 30, 2]
PROMPTS = [5, 9, 3, 12, 4, 7, 6, 3]


def _ids(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(4, vocab) for _ in range(n)]


def sft_rows(vocab: int, teacher: bool = False) -> list[dict[str, Any]]:
    """Packed-format SFT rows; rows 2 and 5 hold two examples each (segments 1 and 2)."""
    rng = random.Random(0)
    rows = []
    for i, (p, c) in enumerate(zip(PROMPTS, LENGTHS)):
        segments = [(p, c)] + ([(3, 5)] if i in (2, 5) else [])
        ids, labels, pos, seg = [], [], [], []
        for s, (sp, sc) in enumerate(segments, start=1):
            toks = _ids(rng, sp + sc, vocab)
            ids += toks
            labels += [IGNORE_INDEX] * sp + toks[sp:]
            pos += list(range(sp + sc))
            seg += [s] * (sp + sc)
        row = {"input_ids": ids, "labels": labels, "position_ids": pos, "segment_ids": seg, "sample_ids": str(i)}
        if teacher:
            n = len(ids)
            row["teacher_ids"] = [rng.randrange(4, vocab) for _ in range(n * K)]
            row["teacher_logprobs"] = sorted((-rng.uniform(0.1, 6.0) for _ in range(n * K)), reverse=True)
        rows.append(row)
    return rows


def rl_rows(vocab: int, teacher: bool = False) -> list[Sequence]:
    """GRPO / on-policy sequences: prompt + completion, behaviour log-probs, advantages; row 7
    is masked out of the loss (an overlong-filtered sample), row 2 has advantage 0 (a group whose
    rewards were all equal). Every 5th behaviour log-prob is far
    below the policy's (about -6.2 on this vocabulary), so its importance weight passes the cap
    (TIS truncates it, the decoupled objective drops the token)."""
    rng = random.Random(1)
    rows = []
    for i, (p, c) in enumerate(zip(PROMPTS, LENGTHS)):
        old = [-8.0 if j % 5 == 4 else -6.2 + rng.uniform(-0.3, 0.3) for j in range(c)]
        row = Sequence(
            ids=_ids(rng, p + c, vocab), start=p, old=old, sample_id=f"{i}#0", adv=rng.uniform(-1.5, 1.5), train=i != 7
        )
        row.adv = 0.0 if i == 2 else row.adv
        if teacher:
            row.teacher = [-rng.uniform(1.0, 8.0) for _ in range(c)]
            row.top_ids = [rng.randrange(4, vocab) for _ in range(c * K)]
            row.top_logprobs = sorted((-rng.uniform(0.1, 6.0) for _ in range(c * K)), reverse=True)
        rows.append(row)
    return rows


def ppo_rows(vocab: int) -> list[Sequence]:
    """``rl_rows`` with a sequence reward each (PPO puts it on the last token)."""
    rows = rl_rows(vocab)
    for r in rows:
        r.reward = r.adv
    return rows


def rm_rows(vocab: int) -> list[dict[str, Any]]:
    rng = random.Random(2)
    return [
        {
            "chosen_ids": _ids(rng, p + c, vocab),
            "rejected_ids": _ids(rng, p + LENGTHS[-1 - i], vocab),
            "chosen_types": [],
            "rejected_types": [],
        }
        for i, (p, c) in enumerate(zip(PROMPTS, LENGTHS))
    ]


def dpo_rows(vocab: int) -> list[dict[str, Any]]:
    rng = random.Random(3)
    return [
        {
            "id": str(i),
            "prompt_ids": _ids(rng, p, vocab),
            "chosen_ids": _ids(rng, c, vocab),
            "rejected_ids": _ids(rng, LENGTHS[-1 - i], vocab),
        }
        for i, (p, c) in enumerate(zip(PROMPTS, LENGTHS))
    ]
