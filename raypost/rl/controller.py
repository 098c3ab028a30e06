"""The async GRPO controller: a small state machine with its policies passed in.

Groups (one prompt, G scored completions) move through four states::

    admitted (running) --complete--> kept | dropped --take--> trained
    admitted (running) --fail--> dropped (counted as failed)

* **admit** hands out the next ticket when the admission policy has capacity. Ticket j is
  the j-th prompt after the run's data cursor; the group records the learner version.
* **complete** files a scored group; the keep policy (DAPO dynamic sampling) may drop it.
* **take** gives the learner the next ``batch`` kept groups *in ticket order*: it waits while
  an earlier ticket is still running. That order, with AReaL's admission rule, bounds the
  staleness of every trained group by ``eta`` (docs/async.md has the argument), so the
  staleness check in ``take`` should never fire; what it drops is counted.
* **advance** moves the learner version after a weight push.

eta = 0 is the synchronous loop: a batch is admitted only after the previous one trained.
No threads or I/O here; raypost.rl.producer drives it, tests step it by hand.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol


class Versioned(Protocol):
    version: int  # the oldest weight version among the group's samples


@dataclass(frozen=True)
class StalenessAdmission:
    """AReaL's rule: capacity = (eta + version + 1) * batch - (accepted + running)."""

    eta: int
    batch: int

    def capacity(self, version: int, accepted: int, running: int) -> int:
        return (self.eta + version + 1) * self.batch - (accepted + running)


KeepPolicy = Callable[[Any, int], bool]  # (group, groups dropped since the last take) -> keep it?


def keep_all(group: Any, dropped: int) -> bool:
    return True


class RolloutController:
    """Admission, buffer and batch order of async GRPO (see the module docstring)."""

    def __init__(self, admission: StalenessAdmission, keep: KeepPolicy = keep_all, version: int = 0) -> None:
        self.admission, self.keep = admission, keep
        self.version = version
        self.accepted = version * admission.batch  # the batches trained before a resume were accepted
        self.next_ticket = 0
        self.head = 0  # smallest ticket neither trained nor discarded
        self.running: dict[int, int] = {}  # ticket -> learner version at admission
        self.done: dict[int, Any | None] = {}  # ticket -> kept group, or None when dropped
        self.dropped_since_take = 0
        self.dropped_filtered = 0  # by the keep policy, over the run
        self.dropped_stale = 0
        self.failed = 0  # groups whose generation or scoring failed, over the run
        self.failed_tickets: list[int] = []  # their tickets, for the budget's window

    def capacity(self) -> int:
        return self.admission.capacity(self.version, self.accepted, len(self.running))

    def admit(self) -> int | None:
        """The next ticket, or None when admitting it could exceed the staleness bound."""
        if self.capacity() <= 0:
            return None
        ticket, self.next_ticket = self.next_ticket, self.next_ticket + 1
        self.running[ticket] = self.version
        return ticket

    def withdraw(self, ticket: int) -> None:
        """Return the last ticket unused (the prompt order ran out)."""
        del self.running[ticket]
        if ticket == self.next_ticket - 1:
            self.next_ticket = ticket

    def complete(self, ticket: int, group: Versioned) -> bool:
        """File a scored group; returns whether it was kept."""
        del self.running[ticket]
        kept = self.keep(group, self.dropped_since_take)
        if kept:
            self.accepted += 1
        else:
            self.dropped_since_take += 1
            self.dropped_filtered += 1
        self.done[ticket] = group if kept else None
        return kept

    def fail(self, ticket: int) -> None:
        """The group could not be generated or scored: its slot counts as dropped, so admission
        refills it with the next prompt."""
        del self.running[ticket]
        self.failed += 1
        self.failed_tickets.append(ticket)
        self.done[ticket] = None

    def failed_within(self, window: int) -> int:
        """Failed groups among the last ``window`` admitted: a failure budget that refills."""
        self.failed_tickets = [t for t in self.failed_tickets if t >= self.next_ticket - window]
        return len(self.failed_tickets)

    def _too_stale(self, group: Versioned) -> bool:
        return self.version - group.version > self.admission.eta

    def _scan(self) -> list[int] | None:
        """Tickets of the next batch in order, or None while an earlier ticket still runs."""
        picks, t = [], self.head
        while len(picks) < self.admission.batch:
            if t not in self.done:
                return None
            group = self.done[t]
            if group is not None and not self._too_stale(group):
                picks.append(t)
            t += 1
        return picks

    def ready(self) -> bool:
        return self._scan() is not None

    def take(self) -> list[Any]:
        """Pop the next batch (call only when ready()); counts stale groups it skipped."""
        picks = self._scan()
        if picks is None:
            raise RuntimeError("take() before ready(): the next batch is not complete")
        chosen, batch = set(picks), []
        for t in range(self.head, picks[-1] + 1):
            group = self.done.pop(t)
            if t in chosen:
                batch.append(group)
            elif group is not None:
                self.dropped_stale += 1
                self.accepted -= 1  # its slot is free again
        self.head = picks[-1] + 1
        self.dropped_since_take = 0
        return batch

    def advance(self, version: int) -> None:
        """The learner pushed ``version``; admission capacity grows by one batch."""
        self.version = version
