"""How pushed weights reach the rollout replicas: ``rollout.weights``, one section per transport,
told apart by its ``transport`` key (``raypost.weights`` has one module per transport)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag

from raypost.config.base import StrictModel


class ShmWeights(StrictModel):
    """Safetensors files in ``dir``/<run>: the fastest on one node. Replicas must share learner
    rank 0's node, unless ``dir`` is a mount every node shares (``shared``)."""

    transport: Literal["shm"] = Field("shm", description="Files in node-local shared memory.")
    dir: str = Field("/dev/shm/raypost", min_length=1, description="Where each run's pushed versions are written.")
    shared: bool = Field(False, description="dir is a mount every node shares: replicas may run on any node.")
    fallback: Literal["object_store"] | None = Field(
        None, description="Also publish each version there; a replica that cannot load a version loads it from there."
    )


class ObjectStoreWeights(StrictModel):
    """Through Ray's object store to replicas on any node, each handing its engine a memfd. No file."""

    transport: Literal["object_store"] = Field("object_store", description="Ray's object store, to any node.")


class CollectiveWeights(StrictModel):
    """A process group (gloo; NCCL on GPU) from learner rank 0 to each replica's engine workers,
    in buckets of ``rollout.weight_bucket_mb``, to any node. No file."""

    transport: Literal["collective"] = Field("collective", description="A process group, bucket by bucket.")
    concurrent_transfers: int = Field(
        4, ge=1, le=64, description="Replicas learner rank 0 sends to at once (one stalled replica holds one)."
    )
    fallback: Literal["object_store"] | None = Field(
        None,
        description="Also publish each version there (one more copy per push, in Ray's object store); a "
        "replica whose transfer fails or times out loads the same version from there.",
    )


def _transport(value: Any) -> str:
    """The member a section belongs to; a section without ``transport`` is shm's (the default)."""
    if isinstance(value, dict):
        return value.get("transport", "shm")
    return getattr(value, "transport", "shm")


WeightTransport = Annotated[
    Annotated[ShmWeights, Tag("shm")]
    | Annotated[ObjectStoreWeights, Tag("object_store")]
    | Annotated[CollectiveWeights, Tag("collective")],
    Discriminator(_transport),
]
