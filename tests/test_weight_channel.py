"""The shm weight channel on a real Ray cluster: the version record is the run's board actor,
not a file, and a version whose file this node cannot read is an error that names the fix."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
import torch


def test_shm_versions_are_recorded_in_ray_and_removed_at_close(ray_cluster):
    import ray

    from raypost.serve.channel import NAMESPACE, channel
    from raypost.serve.weights import WeightsNotReachedError

    wdir = Path(f"/dev/shm/raypost-test-{uuid.uuid4().hex[:8]}")
    learner, replica = channel("shm", wdir), channel("shm", wdir)
    try:
        assert asyncio.run(replica.fetch(0)) == (0, None)  # nothing published: no board yet
        for version in (1, 2, 3):
            learner.publish(version, {"w": torch.full((4,), float(version))})
        version, path = asyncio.run(replica.fetch(0))
        assert version == 3 and Path(path) == wdir / "v3.safetensors"
        assert asyncio.run(replica.fetch(3)) == (3, None)  # already served
        # The record is the board; the folder holds only the last two versions' files.
        assert sorted(p.name for p in wdir.iterdir()) == ["v2.safetensors", "v3.safetensors"]
        board = ray.get_actor(learner.name, namespace=NAMESPACE)
        assert ray.get(board.latest.remote())[0] == 3
        # A replica on another node than learner rank 0 finds the record but not the file.
        (wdir / "v3.safetensors").unlink()
        (wdir / "v2.safetensors").unlink()
        with pytest.raises(WeightsNotReachedError, match="rollout.weight_transport=object_store"):
            asyncio.run(channel("shm", wdir).fetch(0))
    finally:
        learner.close()
    with pytest.raises(ValueError):
        ray.get_actor(learner.name, namespace=NAMESPACE)
    assert not wdir.exists()
