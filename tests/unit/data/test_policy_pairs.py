"""On-policy DPO pairs, pure part: a question's best and worst sample, and what is dropped."""

from __future__ import annotations

import pytest

from raypost.data.preference import best_worst, policy_pairs, ranked_pairs


def test_best_and_worst_sample_first_of_ties():
    assert best_worst([0.0, 1.0, 0.5, 1.0, 0.0], 0.0) == (1, 0)  # first 1.0, first 0.0
    assert best_worst([0.2, 0.1, 0.9], 0.0) == (2, 1)
    assert best_worst([1.0, 1.0, 1.0], 0.0) is None  # all equal: nothing to prefer
    assert best_worst([0.3, 0.5], 0.2) is None  # gap 0.2 is not above 0.2
    assert best_worst([0.3, 0.6], 0.2) == (1, 0)
    with pytest.raises(ValueError, match="at least one sample"):
        best_worst([], 0.0)


def _row(rid: str, rewards: list[float], ids: list[list[int]], prompt: list[int] | None = None) -> dict:
    return {
        "id": rid,
        "question": f"q{rid}",
        "prompt_ids": prompt or [1, 2],
        "rewards": rewards,
        "completions": [f"text{i}" for i in range(len(rewards))],
        "completion_ids": ids,
    }


def test_pairs_are_the_sampled_tokens_and_each_drop_has_its_reason():
    scored = [
        _row("a", [0.0, 1.0, 0.0], [[5], [6, 7], [8]]),
        _row("b", [1.0, 1.0], [[5], [6]]),  # no margin
        _row("c", [0.0, 1.0], [[5, 9], [5, 9]]),  # same tokens, different reward (a noisy reward)
        _row("d", [1.0, 0.0], [[5] * 8, [6]], prompt=[1, 2, 3]),  # 3 + 8 > 10
        _row("e", [0.25, 0.75, 0.5], [[4], [5], [6]]),
    ]
    pairs, dropped = policy_pairs(scored, 0.0, max_seq_len=10)
    assert dropped == {"no_margin": 1, "identical": 1, "too_long": 1}
    assert [p["id"] for p in pairs] == ["a", "e"]
    a, e = pairs
    assert (a["chosen_ids"], a["rejected_ids"], a["prompt_ids"]) == ([6, 7], [5], [1, 2])
    assert (a["chosen"], a["rejected"], a["prompt"]) == ("text1", "text0", "qa")
    assert (e["chosen_reward"], e["rejected_reward"]) == (0.75, 0.25)
    assert (e["chosen_ids"], e["rejected_ids"]) == ([5], [4])


def test_ranked_pairs_take_distinct_low_samples_worst_first_against_the_best_in_turn():
    rewards = [0.0, 1.0, 0.5, 0.0, 1.0, 0.0, 0.2]
    ids = [[1], [2], [3], [1], [4], [5], [6]]  # sample 3 repeats sample 0's tokens
    # rejected, distinct by tokens, by (reward, index): 0 (0.0), 5 (0.0), 6 (0.2), 2 (0.5); 3 repeats 0
    # chosen in turn: 1, 4 (both 1.0)
    assert ranked_pairs(rewards, ids, 0.0, 1) == [(1, 0)]  # = best_worst
    assert ranked_pairs(rewards, ids, 0.0, 3) == [(1, 0), (4, 5), (1, 6)]
    assert ranked_pairs(rewards, ids, 0.0, 64) == [(1, 0), (4, 5), (1, 6), (4, 2)]
    assert ranked_pairs(rewards, ids, 0.6, 64) == [(1, 0), (4, 5), (1, 6)]  # 1.0 - 0.5 is not above 0.6
    assert ranked_pairs([1.0, 0.0], [[7], [7]], 0.0, 4) == []  # the low sample repeats the best one


def test_several_pairs_a_question_get_their_own_ids_and_drops():
    scored = [
        _row("a", [0.0, 1.0, 0.0, 0.0], [[5], [6], [7] * 9, [8]]),  # the 2nd pair is too long
        _row("b", [1.0, 1.0], [[5], [6]]),
    ]
    pairs, dropped = policy_pairs(scored, 0.0, max_seq_len=10, per_question=3)
    assert dropped == {"no_margin": 1, "identical": 0, "too_long": 1}
    assert [(p["id"], p["chosen_ids"], p["rejected_ids"]) for p in pairs] == [("a", [6], [5]), ("a#2", [6], [8])]
