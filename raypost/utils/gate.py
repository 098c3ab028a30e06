"""A start gate between a job's driver and its learner's ranks.

An RL job starts its learner (Ray Train workers: imports, model, DeepSpeed engine) while its
driver deploys the Serve apps and measures held-out accuracy before training, instead of one
after the other. The learner's ranks wait at the gate before their first step; the driver opens
it when both are done, or opens it with an error, which every waiting rank raises. The gate is a
small Ray actor owned by the driver (it ends with the job); a wait has a deadline.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any


class _Gate:
    """The gate's actor: an event, and the error it was opened with (None: go)."""

    def __init__(self) -> None:
        self._opened = asyncio.Event()
        self._error: str | None = None

    async def wait(self) -> str | None:
        await self._opened.wait()
        return self._error

    def open(self, error: str | None) -> bool:
        """Open it (the first call decides: a later one changes nothing); True if this call did."""
        if self._opened.is_set():
            return False
        self._error = error
        self._opened.set()
        return True


@dataclass(frozen=True)
class StartGate:
    """A handle on the gate, picklable into a learner's loop config. ``timeout_s``: how long a
    rank waits (``rollout.ready_timeout_s``); ``what``: what it waits for, for messages."""

    actor: Any
    timeout_s: float
    what: str = "the Serve apps to deploy and the held-out pass before training"

    @classmethod
    def create(cls, timeout_s: float) -> StartGate:
        """A closed gate (from inside a Tune trial's placement group too: the actor takes no CPU
        and is placed outside the group)."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        outside = PlacementGroupSchedulingStrategy(placement_group=None)
        actor = ray.remote(_Gate).options(num_cpus=0, scheduling_strategy=outside).remote()
        return cls(actor, timeout_s)

    def open(self, error: str | None = None) -> bool:
        """Driver: let the learner start (``error`` None), or make every waiting rank raise ``error``.
        Only the first call counts; True if this one opened it."""
        import ray

        return bool(ray.get(self.actor.open.remote(error), timeout=60))

    def wait(self) -> float:
        """A learner rank: block until the gate opens; the seconds waited. Raises RuntimeError when
        it was opened with an error, TimeoutError past ``timeout_s``."""
        import ray

        t0 = time.monotonic()
        try:
            error = ray.get(self.actor.wait.remote(), timeout=self.timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(
                f"the learner waited {self.timeout_s:g} s for {self.what} (rollout.ready_timeout_s); "
                "raise it for a model that takes longer to load"
            ) from None
        except ray.exceptions.RayActorError as err:  # the driver, which owns the gate, is gone
            raise RuntimeError(f"the job's driver ended before the learner's first step: {err}") from None
        if error is not None:
            raise RuntimeError(f"the job stopped before the learner's first step: {error}")
        return time.monotonic() - t0

    def close(self) -> None:
        """Driver, when the job ends: remove the actor."""
        import ray

        ray.kill(self.actor)
