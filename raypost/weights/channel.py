"""The weight channel: how the learner's rank 0 hands a new weight version to the rollout replicas.

One interface; ``rollout.weights.transport`` picks the registered transport (one module each:
``shm``, ``object_store``, ``collective``), and each transport has both of its ends in that
module. The learner calls ``publish_stream`` (or ``publish``, for a dict); each replica calls
``fetch`` before serving a request (it reloads when the version is newer) and hands the
``source`` it returns to its engine's workers, which read the tensors through the same
transport's ``tensors`` (``raypost.weights.vllm_ext``).

Whatever the transport, the version record lives in Ray: a small named actor (the board) holds
the newest version and where it is. The board is detached (a replica that dies does not take
the record with it) and is removed by ``close`` when the run ends. A replica that starts or
restarts late asks the board before its first request, so it serves the latest version.

A channel is named by its run's ``key`` and is a plain picklable object: the phase that starts a
run opens it and passes it to the learner's loop config, the rollout app and the client; each
process makes its own connections on first use.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import torch

from raypost.weights.specs import Spec, specs_of

NAMESPACE = "raypost"
TRANSPORTS: dict[str, type[WeightChannel]] = {}
C = TypeVar("C", bound="type[WeightChannel]")


def register(name: str) -> Callable[[C], C]:
    """Class decorator: the transport ``rollout.weights.transport: <name>`` selects."""

    def add(cls: C) -> C:
        cls.transport = name
        TRANSPORTS[name] = cls
        return cls

    return add


class WeightChannel(ABC):
    """Versions of the policy's weights, from the learner's rank 0 to the replicas of one run.

    ``settings``: the transport's section of the config (``raypost.config.weights``); ``key``: the
    run's name for its board (and, shm, its folder); ``workers``: engine workers per replica;
    ``bucket_mb``: MiB a transport passes on at a time."""

    transport: str

    def __init__(
        self, settings: Any, key: str, workers: int = 1, bucket_mb: int = 64, timeout_s: float = 600.0
    ) -> None:
        self.settings, self.key, self.workers, self.bucket_mb = settings, key, workers, bucket_mb
        self.timeout_s = timeout_s  # rollout.weight_timeout_s: the board's answers, within it
        self._board: Any = None

    def __getstate__(self) -> dict[str, Any]:
        """What crosses to another process: the settings and names, none of this process's state."""
        return {
            "settings": self.settings,
            "key": self.key,
            "workers": self.workers,
            "bucket_mb": self.bucket_mb,
            "timeout_s": self.timeout_s,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        type(self).__init__(self, **state)

    def describe(self) -> str:
        """Where the versions go, for messages."""
        return f"weight transport {self.transport}, run {self.key}"

    def publish(self, version: int, state: Mapping[str, torch.Tensor]) -> None:
        """Learner rank 0: make ``state`` the newest version."""
        self.publish_stream(version, specs_of(state), [state])

    @abstractmethod
    def publish_stream(
        self, version: int, specs: Sequence[Spec], buckets: Iterable[Mapping[str, torch.Tensor]]
    ) -> None:
        """Learner rank 0: make the tensors of ``specs`` the newest version. They arrive in
        ``buckets`` (dicts, in ``specs``' order), each passed on as it comes, so a learner that
        gathers its weights bucket by bucket (ZeRO-3) never holds the whole model."""

    @abstractmethod
    async def fetch(self, have: int) -> tuple[int, dict[str, Any] | None]:
        """Replica: (newest version, the ``source`` its engine workers load it from, a JSON-able
        dict with this channel's ``transport``); (have, None) when the replica already serves the
        newest version or nothing was published yet."""

    @staticmethod
    @abstractmethod
    def tensors(source: Mapping[str, Any], worker: Any) -> Iterator[tuple[str, torch.Tensor]]:
        """Engine worker: (name, tensor) of each tensor of ``source`` (``fetch``'s). ``worker``
        is vLLM's worker (its ``rank`` and ``device``)."""

    async def reload(self, have: int, load: Callable[[int, dict[str, Any]], Awaitable[None]]) -> int | None:
        """Replica: ``fetch`` the newest version and ``await load(version, source)`` (into the
        engine's workers); the version, or None when there is nothing other than ``have``."""
        version, source = await self.fetch(have)
        if source is None:
            return None
        await load(version, source)
        return version

    @property
    def reload_deadline_s(self) -> float:
        """Replica: how long a ``reload`` may take in all."""
        return self.timeout_s

    async def newer_than(self, have: int) -> bool:
        """Replica: whether a version other than ``have`` was published (cheap: no transfer)."""
        version, boxed = await self._latest()
        return boxed is not None and version != have

    async def ack(self, replica: str, version: int) -> bool:
        """Replica: say on the board that it now serves ``version``; False when there is no board
        yet (nothing published: the replica says it again once there is)."""
        if self._board is None and (await self._latest())[1] is None:
            return False
        await asyncio.wait_for(self._board.ack.remote(replica, version), self.timeout_s)
        return True

    def served_versions(self, max_age_s: float = 600.0) -> dict[str, int]:
        """Learner: the version each replica said it serves within the last ``max_age_s`` seconds
        (a replica that died stops saying it); {} before the first publish."""
        import ray

        if self._board is None:
            return {}
        return ray.get(self._board.versions.remote(max_age_s), timeout=self.timeout_s)

    def stop_serving(self) -> None:  # noqa: B027 - a no-op unless the transport serves from the learner
        """Learner rank 0, when its loop ends: stop whatever serves the weights from its process."""

    def release(self) -> None:  # noqa: B027 - a no-op unless the transport holds replica memory
        """A replica stops: release what it holds for its engine's workers (object_store: its memfd)."""

    def close(self, wait_s: float = 30.0) -> None:
        """The run ended (called where the run was started): remove the board, and wait up to
        ``wait_s`` until its name is free (``ray.kill`` returns first: a run of the same name started
        at once could otherwise get the dying board); the pushed weights are in the checkpoints."""
        import ray

        try:
            ray.kill(ray.get_actor(self.board_name, namespace=NAMESPACE))
        except ValueError:  # never created, or already gone
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                ray.get_actor(self.board_name, namespace=NAMESPACE)
            except ValueError:
                return
            time.sleep(0.1)

    @property
    def board_name(self) -> str:
        return f"raypost-weights:{self.key}"

    def _record(self, version: int, boxed: list[Any]) -> None:
        """Learner rank 0: name ``version`` and where it is on the board, within ``timeout_s``."""
        import ray

        try:
            ray.get(self._created_board().put.remote(version, boxed), timeout=self.timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(
                f"{self.describe()}: the board did not record version {version} within "
                f"rollout.weight_timeout_s={self.timeout_s:g}"
            ) from None

    def _created_board(self) -> Any:
        """The board, created by the first publish (replicas only look it up)."""
        import ray

        if self._board is None:
            self._board = (
                ray.remote(WeightBoard)
                .options(
                    name=self.board_name,
                    namespace=NAMESPACE,
                    get_if_exists=True,
                    lifetime="detached",
                    num_cpus=0,
                    max_restarts=0,
                )
                .remote()
            )
        return self._board

    async def _latest(self) -> tuple[int, list[Any] | None]:
        """The board's newest (version, boxed location); (0, None) before the first publish."""
        import ray

        if self._board is None:
            try:
                self._board = ray.get_actor(self.board_name, namespace=NAMESPACE)
            except ValueError:  # nothing published yet
                return 0, None
        return await asyncio.wait_for(self._board.latest.remote(), self.timeout_s)


class WeightBoard:
    """A run's version record, as a Ray actor: the last published version (also an older one,
    when a learner resumes from an earlier checkpoint) and where the last ``keep`` publishes are:
    a file path (shm), object refs (object_store) or a server's address (collective), each inside
    a list, so Ray hands callers a ref itself. Each replica acknowledges the version it serves."""

    def __init__(self, keep: int = 2) -> None:
        self.keep = keep
        self.published: list[tuple[int, list[Any]]] = []
        self.acks: dict[str, tuple[int, float]] = {}  # replica -> (version it serves, when it said so)

    def put(self, version: int, boxed_ref: list[Any]) -> None:
        self.published = [*self.published, (version, boxed_ref)][-self.keep :]

    def latest(self) -> tuple[int, list[Any] | None]:
        return self.published[-1] if self.published else (0, None)

    def ack(self, replica: str, version: int) -> None:
        self.acks[replica] = (version, time.time())

    def versions(self, max_age_s: float) -> dict[str, int]:
        now = time.time()
        return {r: v for r, (v, t) in self.acks.items() if now - t <= max_age_s}


def open_channel(rollout: Any, key: str) -> WeightChannel:
    """The channel that ``rollout`` (a RolloutConfig) names, for the run ``key``: its transport's,
    or a ``FallbackChannel`` over it when ``rollout.weights.fallback`` is set."""
    from raypost.weights.fallback import FallbackChannel

    settings = rollout.weights
    kind = FallbackChannel if getattr(settings, "fallback", None) else TRANSPORTS[settings.transport]
    return kind(
        settings,
        key,
        workers=rollout.tensor_parallel_size,
        bucket_mb=rollout.weight_bucket_mb,
        timeout_s=rollout.weight_timeout_s,
    )


def engine_tensors(source: Mapping[str, Any], worker: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """Engine worker: the tensors of any transport's ``source``, through its registered class."""
    return TRANSPORTS[source["transport"]].tensors(source, worker)
