"""An external harness's sessions on the rollout app, recorded as training episodes.

A harness that drives the policy through ``POST /v1/chat/completions`` (its ``base_url`` pointed
at the rollout app) names its conversation with ``session_id`` (OpenAI client:
``extra_body={"session_id": ...}``). Each turn's prompt ids, sampled ids, behaviour log-probs and
weight version are recorded, as the replica produced them. ``POST /v1/sessions/{id}/end`` with the
episode's reward closes it: the turns become one ``Episode``, the layout the agent loop trains on
(the first prompt; then each turn's sampled ids, mask 1; between turns, the tokens the next prompt
adds, mask 0). A next prompt that does not start with everything before it (the harness edited
or re-rendered the history into other tokens) can't be trained as sampled: the session is refused
with the turn named. ``GET /v1/sessions/episodes?take=N`` hands out finished episodes, oldest
first, once each.

The book (``SessionBook``) is one named Ray actor per rollout app, shared by its replicas; its
limits bound memory: open sessions, turns per session, finished episodes kept, and idle time.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from fastapi import HTTPException
from pydantic import BaseModel, ConfigDict, Field

from raypost.rl.episode import Episode
from raypost.serve.chat_api import SESSION_ID


class SessionError(ValueError):
    """A session that can't take this turn or can't become an episode; the message says why."""


class SessionEnd(BaseModel):
    """``POST /v1/sessions/{id}/end``: the episode's reward, and the group it is compared within."""

    model_config = ConfigDict(extra="forbid")
    reward: float = Field(ge=-1e6, le=1e6)  # the bounds refuse NaN and infinities too
    group: str | None = Field(None, pattern=SESSION_ID)


@dataclass
class Turn:
    prompt_ids: list[int]  # [P_k] what the replica was asked, templated
    ids: list[int]  # [C_k] what it sampled
    logprobs: list[float]  # [C_k] behaviour log-probs of those ids
    version: int  # the weight version that sampled them


def assemble(turns: Sequence[Turn]) -> Episode:
    """The session's turns as one episode: turn 1's prompt, then per turn the tokens its prompt
    adds to everything before it (an observation, mask 0) and its sampled ids (mask 1)."""
    if not turns:
        raise SessionError("the session has no turns")
    ep = Episode(prompt_ids=list(turns[0].prompt_ids))
    for k, turn in enumerate(turns):
        if k:
            have = ep.all_ids
            if turn.prompt_ids[: len(have)] != have:
                at = next((i for i, (a, b) in enumerate(zip(have, turn.prompt_ids)) if a != b), len(turn.prompt_ids))
                raise SessionError(
                    f"turn {k + 1}'s prompt does not start with the session's tokens so far (they differ at token "
                    f"{at}): send the history back as the replica returned it (assistant messages unchanged)"
                )
            ep.add_observation(list(turn.prompt_ids[len(have) :]))
        ep.add_model(list(turn.ids), list(turn.logprobs), turn.version)
    return ep


@dataclass
class _Open:
    turns: list[Turn] = field(default_factory=list)
    seen: float = 0.0


class SessionBook:
    """Open sessions and finished episodes of one rollout app, within bounds."""

    def __init__(
        self,
        max_open: int = 4096,
        max_turns: int = 256,
        max_finished: int = 100_000,
        idle_s: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_open, self.max_turns, self.max_finished, self.idle_s = max_open, max_turns, max_finished, idle_s
        self.clock = clock
        self.open: OrderedDict[str, _Open] = OrderedDict()
        self.finished: list[dict[str, Any]] = []
        self.dropped: dict[str, int] = {"idle": 0, "refused": 0, "overflow": 0}

    def record(self, session: str, turn: dict[str, Any]) -> int:
        """Add a turn; returns the session's turns so far."""
        self._expire()
        entry = self.open.get(session)
        if entry is None:
            if len(self.open) >= self.max_open:
                raise SessionError(f"{self.max_open} sessions are open: end some before starting more")
            entry = self.open[session] = _Open()
        if len(entry.turns) >= self.max_turns:
            raise SessionError(f"session {session} has {self.max_turns} turns, the most one may have: end it")
        entry.turns.append(Turn(**turn))
        entry.seen = self.clock()
        self.open.move_to_end(session)
        return len(entry.turns)

    def end(self, session: str, reward: float, group: str | None = None) -> dict[str, Any]:
        """Close a session as an episode; returns its summary."""
        entry = self.open.pop(session, None)
        if entry is None:
            raise KeyError(f"no open session {session!r} (never started, ended, or idle past {self.idle_s:g} s)")
        try:
            ep = assemble(entry.turns)
        except SessionError:
            self.dropped["refused"] += 1
            raise
        record = {"session": session, "group": group, "reward": reward, **_fields(ep)}
        self.finished.append(record)
        if len(self.finished) > self.max_finished:
            self.finished.pop(0)
            self.dropped["overflow"] += 1
        return {k: record[k] for k in ("session", "group", "reward", "turns", "version")} | {
            "model_tokens": sum(ep.mask),
            "observation_tokens": len(ep.mask) - sum(ep.mask),
        }

    def take(self, n: int) -> list[dict[str, Any]]:
        """Up to ``n`` finished episodes, oldest first; each is handed out once."""
        out, self.finished = self.finished[:n], self.finished[n:]
        return out

    def stats(self) -> dict[str, Any]:
        self._expire()
        return {"open": len(self.open), "finished": len(self.finished), "dropped": dict(self.dropped)}

    def _expire(self) -> None:
        now = self.clock()
        while self.open and now - next(iter(self.open.values())).seen > self.idle_s:
            self.open.popitem(last=False)
            self.dropped["idle"] += 1


def _fields(ep: Episode) -> dict[str, Any]:
    keep = ("prompt_ids", "ids", "mask", "logprobs", "version", "turns")
    return {k: v for k, v in asdict(ep).items() if k in keep}


def book_name(app: str) -> str:
    return f"raypost-sessions:{app}"


def session_book(app: str) -> Any:
    """The app's book (a detached named actor, created by the first replica that records)."""
    import ray

    from raypost.weights.channel import NAMESPACE

    return (
        ray.remote(SessionBook)
        .options(name=book_name(app), namespace=NAMESPACE, get_if_exists=True, lifetime="detached", num_cpus=0)
        .remote()
    )


def drop_book(app: str) -> None:
    """Remove the app's book, if it has one (the app is going away)."""
    import ray

    from raypost.weights.channel import NAMESPACE

    try:
        ray.kill(ray.get_actor(book_name(app), namespace=NAMESPACE))
    except ValueError:
        pass


async def record_turn(app: str, session: str, prompt_ids: list[int], group: dict[str, Any]) -> None:
    """Record a ``/v1/chat/completions`` answer as the session's next turn (409 past a limit)."""
    c = group["completions"][0]
    turn = {"prompt_ids": prompt_ids, "ids": c["token_ids"], "logprobs": c["logprobs"], "version": group["version"]}
    try:
        await session_book(app).record.remote(session, turn)
    except SessionError as err:
        raise HTTPException(409, f"session_id: {err}") from None


async def book_call(app: str, method: str, *args: Any) -> Any:
    """A call on the app's book: 404 for an unknown session, 422 for one that can't be an episode."""
    try:
        return await getattr(session_book(app), method).remote(*args)
    except SessionError as err:
        raise HTTPException(422, str(err)) from None
    except KeyError as err:
        raise HTTPException(404, str(err.args[0] if err.args else err)) from None
