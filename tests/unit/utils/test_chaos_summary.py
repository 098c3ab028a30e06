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


def test_a_record_left_torn_or_holding_the_injected_row_is_not_clean(tmp_path):
    """The torn and disk drills call a run survived only if its records came out whole: every
    line parses and the injected row is gone."""
    from benchmarks.chaos_grpo import GRPOJob
    from benchmarks.chaos_store import TORN, _records_clean

    job = GRPOJob(head=None, root=tmp_path, name="r", steps=2)  # type: ignore[arg-type]
    job.run.mkdir()
    for name in ("trained_samples.jsonl", "metrics.jsonl"):
        (job.run / name).write_text('{"phase": "grpo", "step": 1, "ids": ["a#0"]}\n')
    assert _records_clean(job)
    with (job.run / "metrics.jsonl").open("a") as fh:
        fh.write(TORN)
    assert not _records_clean(job)
    (job.run / "metrics.jsonl").write_text(TORN + '"]}\n')  # parses, but is the injected step 999
    assert not _records_clean(job)


def test_a_push_drill_row_counts_the_kills_that_landed_inside_a_push():
    runs = [
        {"drill": "push-shm", "try": k, "survived": True, "landed_in_push": k != 1, "staleness_max": d}
        for k, d in enumerate([0, 2, 1])
    ]
    (row,) = worst_by_drill(runs)
    assert row == {"drill": "push-shm", "tries": 3, "survived": True, "staleness_max": 2, "landed_in_push": 2}
