"""An external harness's session as a training episode (``raypost.serve.sessions``): the turns'
token layout, the refusal of a history the harness changed, and the book's bounds."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from raypost.serve.sessions import SessionBook, SessionEnd, SessionError, Turn, assemble

P = [1, 2, 3]  # turn 1's prompt
A = [10, 11, 2]  # turn 1's sampled ids (2: EOS)
OBS = [4, 5, 6]  # what turn 2's prompt adds: the tool's answer, the next assistant header
B = [12, 2]


def turns() -> list[Turn]:
    return [Turn(P, A, [-0.1, -0.2, -0.3], 4), Turn(P + A + OBS, B, [-0.5, -0.6], 5)]


def test_the_turns_become_the_agent_loops_layout_with_the_model_tokens_masked_in():
    ep = assemble(turns())
    assert ep.prompt_ids == P and ep.ids == A + OBS + B and ep.all_ids == P + A + OBS + B
    assert ep.mask == [1, 1, 1, 0, 0, 0, 1, 1]
    assert ep.logprobs == [-0.1, -0.2, -0.3, 0.0, 0.0, 0.0, -0.5, -0.6]
    assert ep.version == 4 and ep.turns == 2  # the oldest weights among the turns


def test_a_history_sent_back_in_other_tokens_is_refused_naming_the_turn():
    edited = [turns()[0], Turn(P + [10, 99, 2] + OBS, B, [-0.5, -0.6], 5)]
    with pytest.raises(SessionError, match=r"turn 2's prompt .* differ at token 4"):
        assemble(edited)
    with pytest.raises(SessionError, match="no turns"):
        assemble([])


def test_the_book_ends_sessions_into_episodes_handed_out_once():
    book = SessionBook()
    for t in turns():
        book.record("s1", vars(t))
    book.record("s2", vars(turns()[0]))
    summary = book.end("s1", 1.0, "task-7")
    assert summary == {
        "session": "s1",
        "group": "task-7",
        "reward": 1.0,
        "turns": 2,
        "version": 4,
        "model_tokens": 5,
        "observation_tokens": 3,
    }
    [ep] = book.take(10)
    assert ep["ids"] == A + OBS + B and ep["mask"] == [1, 1, 1, 0, 0, 0, 1, 1] and ep["reward"] == 1.0
    assert book.take(10) == [] and book.stats() == {
        "open": 1,
        "finished": 0,
        "dropped": {"idle": 0, "refused": 0, "overflow": 0},
    }
    with pytest.raises(KeyError, match="no open session 's1'"):
        book.end("s1", 1.0)


def test_the_books_bounds_open_sessions_turns_idle_time_and_finished_episodes():
    now = [0.0]
    book = SessionBook(max_open=2, max_turns=2, max_finished=1, idle_s=10.0, clock=lambda: now[0])
    turn = vars(turns()[0])
    book.record("a", turn)
    book.record("b", turn)
    with pytest.raises(SessionError, match="2 sessions are open"):
        book.record("c", turn)
    book.record("a", vars(turns()[1]))
    with pytest.raises(SessionError, match="has 2 turns"):
        book.record("a", turn)
    now[0] = 11.0  # both idle past 10 s: dropped, counted
    assert book.stats()["open"] == 0 and book.stats()["dropped"]["idle"] == 2
    for name in ("c", "d"):
        book.record(name, turn)
        book.end(name, 0.0)
    assert [e["session"] for e in book.take(5)] == ["d"] and book.stats()["dropped"]["overflow"] == 1
    book.record("e", turn)
    book.record("e", vars(Turn([7], B, [-0.5, -0.6], 5)))
    with pytest.raises(SessionError):
        book.end("e", 1.0)
    assert book.stats()["dropped"]["refused"] == 1 and book.stats()["open"] == 0


@pytest.mark.parametrize("reward", [float("nan"), float("inf"), 1e7])
def test_an_end_with_a_reward_that_is_not_a_bounded_number_is_refused(reward):
    with pytest.raises(ValidationError, match="reward"):
        SessionEnd(reward=reward)
    with pytest.raises(ValidationError, match="group"):
        SessionEnd(reward=1.0, group="no spaces allowed")
