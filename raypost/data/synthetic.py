"""The embedded offline task: seeded GSM8K-style arithmetic word problems.

Every problem has an integer answer and a worked solution in GSM8K's format
(one line per operation, then ``#### <answer>``), so the same parsing, rewards and
evaluation serve GSM8K itself.

Optionally a share of the training problems carries a noisy demonstration (``demo``), as
distilled SFT data does: a weak teacher's guess, ``#### <the question's first number>``, with
no worked line. The gold ``answer`` is unchanged, so rewards and evaluation still score the true
result; only SFT imitates the demo.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from typing import Any

from raypost.data.tool_calls import format_tool_call

NAMES = [
    "Ava",
    "Ben",
    "Cara",
    "Dan",
    "Eli",
    "Fay",
    "Gus",
    "Hana",
    "Ivy",
    "Jon",
    "Kim",
    "Leo",
    "Mia",
    "Ned",
    "Ola",
    "Pia",
]
ITEMS = ["apples", "pens", "books", "stickers", "coins", "cards", "shells", "marbles", "eggs", "stamps"]


def _add(r: random.Random, hi: int) -> tuple[str, list[str], int]:
    a, b = r.randint(1, hi), r.randint(1, hi)
    n, item = r.choice(NAMES), r.choice(ITEMS)
    q = f"{n} has {a} {item}. {n} buys {b} more {item}. How many {item} does {n} have now?"
    return q, [f"{a} + {b} = {a + b}"], a + b


def _sub(r: random.Random, hi: int) -> tuple[str, list[str], int]:
    a, b = sorted((r.randint(1, hi), r.randint(1, hi)), reverse=True)
    n, m, item = *r.sample(NAMES, 2), r.choice(ITEMS)
    q = f"{n} has {a} {item}. {n} gives {b} {item} to {m}. How many {item} does {n} have left?"
    return q, [f"{a} - {b} = {a - b}"], a - b


def _mul(r: random.Random, hi: int) -> tuple[str, list[str], int]:
    a, b = r.randint(2, min(hi, 9)), r.randint(2, min(hi, 9))
    item = r.choice(ITEMS)
    q = f"Each box holds {a} {item}. How many {item} are in {b} boxes?"
    return q, [f"{a} * {b} = {a * b}"], a * b


def _two_step(r: random.Random, hi: int) -> tuple[str, list[str], int]:
    a, b = r.randint(1, hi), r.randint(1, hi)
    c = r.randint(1, a + b)
    n, item = r.choice(NAMES), r.choice(ITEMS)
    q = f"{n} has {a} {item}. {n} finds {b} more {item}, then gives away {c} {item}. How many {item} does {n} have now?"
    return q, [f"{a} + {b} = {a + b}", f"{a + b} - {c} = {a + b - c}"], a + b - c


def _chain(r: random.Random, hi: int) -> tuple[str, list[str], int]:
    """3-5 operands joined by + - * (* at most twice), read with the usual precedence."""
    lo = 10 if hi >= 100 else 1
    nums = [r.randint(lo, hi) for _ in range(r.randint(3, 5))]
    ops = r.choices(["+", "-", "*"], weights=[2, 2, 1], k=len(nums) - 1)
    while ops.count("*") > 2:
        ops[ops.index("*")] = "+"
    expr = " ".join([str(nums[0])] + [f"{o} {n}" for o, n in zip(ops, nums[1:])])
    result = _arith(expr)
    return f"What is {expr}?", [f"{expr} = {result}"], result


def _arith(expr: str) -> int:
    """The value of a generated ``a op b op c ...`` (+ - * on integers), * before + and -."""
    tokens = expr.split()
    terms, signs, term = [], [1], int(tokens[0])
    for op, num in zip(tokens[1::2], tokens[2::2]):
        if op == "*":
            term *= int(num)
        else:
            terms.append(term)
            signs.append(1 if op == "+" else -1)
            term = int(num)
    terms.append(term)
    return sum(s * t for s, t in zip(signs, terms))


ONE_STEP: list[Callable[[random.Random, int], tuple[str, list[str], int]]] = [_add, _sub, _mul]


def make_problem(
    r: random.Random, max_operand: int, two_step_fraction: float, task: str = "word_problems"
) -> dict[str, Any]:
    """One problem: {'question', 'answer' (GSM8K style: steps + '#### n')}. ``task`` chains: a bare
    expression of 3-5 operands (the calculator agent's task)."""
    if task == "chains":
        kind = _chain
    else:
        kind = _two_step if r.random() < two_step_fraction else r.choice(ONE_STEP)
    question, steps, result = kind(r, max_operand)
    return {"question": question, "answer": "\n".join(steps) + f"\n#### {result}"}


def guess(question: str) -> str:
    """The weak teacher's demonstration: the question's first number as the answer."""
    first = re.search(r"\d+", question)
    return f"#### {first.group() if first else 0}"


def tool_demo(row: dict[str, Any], answer: bool) -> dict[str, str]:
    """The calculator agent's demo, one turn: the call on the row's expression, or (``answer``) the
    answer after that call and its result (``prior_turns``, in the prompt, not trained)."""
    expr = row["question"].removeprefix("What is ").removesuffix("?")
    call = format_tool_call("calculator", {"expression": expr})
    if not answer:
        return {"demo": call}
    result = row["answer"].rsplit("#### ", 1)[1]
    turns = [{"role": "assistant", "content": call}, {"role": "tool", "content": result}]
    return {"demo": f"#### {result}", "prior_turns": json.dumps(turns)}


def generate(
    n: int,
    seed: int,
    max_operand: int = 20,
    two_step_fraction: float = 0.3,
    prefix: str = "syn",
    guess_fraction: float = 0.0,
    task: str = "word_problems",
    tool_demos: bool = False,
    tool_answer_share: float = 0.5,
) -> list[dict[str, Any]]:
    """``n`` problems from ``seed``; rows carry a stable ``id``. A ``guess_fraction`` share of
    rows get a ``demo`` (see the module docstring); the problems themselves do not depend on it."""
    r, noisy, demos = random.Random(seed), random.Random(seed + 7919), random.Random(seed + 104729)
    rows = []
    for i in range(n):
        row = make_problem(r, max_operand, two_step_fraction, task)
        row["id"] = f"{prefix}-{seed}-{i}"
        if tool_demos:
            row.update(tool_demo(row, answer=demos.random() < tool_answer_share))
        elif guess_fraction and noisy.random() < guess_fraction:
            row["demo"] = guess(row["question"])
        rows.append(row)
    return rows
