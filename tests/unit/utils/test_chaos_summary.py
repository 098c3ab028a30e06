"""``benchmarks.chaos.worst_by_drill``: the drills' table shows each drill's worst run: one run
that did not survive, or lost one prompt, is what the row says."""

from __future__ import annotations

from benchmarks.chaos import worst_by_drill


def test_the_worst_run_of_each_drill_is_its_row():
    runs = [
        {"drill": "replica", "try": 0, "survived": True, "prompts_lost": 0, "steps_lost": 0, "recover_s": 40.1},
        {"drill": "replica", "try": 1, "survived": True, "prompts_lost": 1, "steps_lost": 0, "recover_s": 55.0},
        {"drill": "replica", "try": 2, "survived": False, "prompts_lost": 0, "steps_lost": 2, "recover_s": None},
        {"drill": "gcs", "try": 0, "sent_during_outage": 10, "answered_during_outage": 10},
        {"drill": "gcs", "try": 1, "sent_during_outage": 12, "answered_during_outage": 11},
    ]
    assert worst_by_drill(runs) == [
        {"drill": "replica", "tries": 3, "survived": False, "steps_lost": 2, "prompts_lost": 1, "recover_s": 55.0},
        {"drill": "gcs", "tries": 2, "survived": False},
    ]
    assert worst_by_drill(runs[:2])[0]["survived"] and worst_by_drill(runs[3:4])[0]["survived"]
