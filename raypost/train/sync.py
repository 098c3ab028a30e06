"""What learners that sample from Serve replicas share: rank 0's batch sent to every rank,
and the weights pushed to the replicas as a new version, bucket by bucket."""

from __future__ import annotations

import time
from typing import Any

from raypost.train.collectives import barrier
from raypost.weights import WeightChannel
from raypost.weights.buckets import weight_buckets


def push_weights(
    engine: Any, zero_stage: int, version: int, chan: WeightChannel, rank: int, bucket_mb: int = 64
) -> float:
    """Publish the policy's weights as ``version`` (rank 0 publishes; every rank must call: under
    ZeRO-3 all ranks gather each bucket together). Returns seconds."""
    t0 = time.perf_counter()
    specs, buckets = weight_buckets(engine, zero_stage, bucket_mb << 20)
    if rank == 0:
        chan.publish_stream(version, specs, buckets)
    else:
        for _ in buckets:  # this rank's part of each bucket's gather
            pass
    barrier()
    return time.perf_counter() - t0
