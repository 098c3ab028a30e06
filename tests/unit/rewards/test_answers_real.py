"""Final-answer extraction as pretrained models write answers: hand-made cases, and real
greedy answers of SmolLM2-135M-Instruct recorded by tests/data/record_smollm2_answers.py (plain
questions and a prompt asking for '#### n'; synthetic and GSM8K test problems)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raypost.data.answers import extract_answer
from raypost.rewards.verifiers import accuracy_reward, answers_match

REAL = [json.loads(line) for line in (Path(__file__).parents[2] / "data" / "smollm2_answers.jsonl").open()]


@pytest.mark.parametrize(
    "text, strict, flexible",
    [
        ("4 + 3 = 7\n#### 7", "7", "7"),
        ("so the result is \\boxed{\\frac{1}{2}}.", None, "\\frac{1}{2}"),
        ("\\boxed{12} and later \\boxed{13}", None, "13"),  # the last box
        ("The answer is 1,234.", None, "1,234"),
        ("Answer: $5 per day, 7 days", None, "5"),  # "answer:" before the last number
        ("she has 10 - 9 = 1 books left.", None, "1"),  # prose: the last number
        ("It drops to -3 degrees", None, "-3"),
        ("#### 7\nthen 9 more", "7", "7"),  # an explicit '####' wins over everything after it
        ("no number here", None, None),
    ],
)
def test_extraction_by_hand(text, strict, flexible):
    assert extract_answer(text, "strict") == strict
    assert extract_answer(text, "flexible") == flexible


def test_unknown_extraction_names_the_choices():
    with pytest.raises(ValueError, match="strict.*flexible"):
        extract_answer("1", "lenient")


# Row of REAL -> (strict, flexible) as a reader takes the final answer of that completion.
READ = {
    1: ("18", "18"),  # "#### 18\nThe answer is: 18"
    2: (None, "30"),  # cut at the token budget after "... 6 * 5 = 30 eggs ... is the sum"
    6: (None, "0"),  # "Gus has 11 - 11 = 0 shells left."
    11: ("180", "180"),  # "#### 180\nThe answer is: 180"
    13: ("18", "18"),  # "#### 18\n\nThe answer is 18."
    14: (None, "6"),  # "... 6 boxes = 6 * 2 = 12 eggs\n\nThe answer is 6."
    18: (None, "20"),  # "12 + 11 = 20\nGus has 20 shells left."
    19: (None, "40"),  # "Solving this equation: 8 * 5 = 40\n\nThe answer is 40."
    22: (None, "80,000"),  # the last number of a cut-off GSM8K answer
}


@pytest.mark.parametrize("row", sorted(READ))
def test_real_smollm2_answers_are_read_as_a_reader_reads_them(row):
    strict, flexible = READ[row]
    text = REAL[row]["completion"]
    assert extract_answer(text, "strict") == strict, text[-200:]
    assert extract_answer(text, "flexible") == flexible, text[-200:]


def test_accuracy_reward_on_real_answers_strict_vs_flexible():
    """On these 24 real answers only the flexible reading credits the two right ones, which say
    '... = 30 eggs' and 'The answer is 40.' and never write '####'."""
    answers = [r["gold"] for r in REAL]
    completions = [r["completion"] for r in REAL]
    strict = accuracy_reward([""] * len(REAL), completions, answer=answers)
    flexible = accuracy_reward([""] * len(REAL), completions, answer=answers, extract="flexible")
    assert sum(strict) == 0
    assert [i for i, v in enumerate(flexible) if v] == [2, 19]
    # the TRL signature: the builtin takes the spec's kwargs like any column
    assert answers_match("The answer is 40.", "8 * 5 = 40\n#### 40", "flexible")


def test_a_reward_specs_kwargs_reach_the_function():
    """``{name: accuracy, fn: accuracy, kwargs: {extract: flexible}}`` in a reward config."""
    from raypost.config import build
    from raypost.config.serve import RewardSpec
    from raypost.rewards.compose import WeightedReward, call, resolve

    spec = build(RewardSpec, {"name": "acc", "fn": "accuracy", "kwargs": {"extract": "flexible"}})
    flexible = WeightedReward(spec.name, resolve(spec.fn), spec.weight, kwargs=spec.kwargs)
    strict = WeightedReward("acc", resolve("accuracy"), 1.0)
    columns = {"answer": ["40", "40"]}
    completions = ["The answer is 40.", "#### 41"]
    assert call(flexible, ["q", "q"], completions, columns) == [1.0, 0.0]
    assert call(strict, ["q", "q"], completions, columns) == [0.0, 0.0]
