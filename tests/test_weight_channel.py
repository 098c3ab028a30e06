"""The weight channels on a real Ray cluster: the version record is the run's board actor, not a
file; a shm version whose file this node cannot read is an error that names the fix; the
collective channel streams the newest version in buckets over a gloo group, and a receiver that
never joins fails only its own transfer."""

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
        version, source = asyncio.run(replica.fetch(0))
        assert version == 3 and Path(source["file"]) == wdir / "v3.safetensors"
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


def test_buckets_hold_whole_tensors_up_to_the_bucket_size():
    from raypost.serve.collective import buckets_of

    # (name, dtype, shape, offset, bytes) as channel.pack lays them out
    meta = [("a", "float32", [4], 0, 16), ("b", "float32", [4], 16, 16), ("c", "float32", [16], 32, 64),
            ("d", "float32", [2], 96, 8)]
    assert buckets_of(meta, 32) == [(0, 32), (32, 96), (96, 104)]  # c alone: larger than a bucket
    assert buckets_of(meta, 1000) == [(0, 104)]
    assert buckets_of([], 32) == []


def test_collective_channel_streams_the_newest_version_in_buckets(ray_cluster):
    from raypost.serve.channel import channel
    from raypost.serve.collective import receive

    wdir = Path(f"/dev/shm/raypost-test-{uuid.uuid4().hex[:8]}")
    learner, replica = channel("collective", wdir, bucket_mb=1), channel("collective", wdir)
    g = torch.Generator().manual_seed(0)
    try:
        assert asyncio.run(replica.fetch(0)) == (0, None)
        for version in (1, 2):
            state = {"embed": torch.randn(300, 1024, generator=g), "norm": torch.randn(8, generator=g),
                     "half": torch.randn(64, 64, generator=g).to(torch.bfloat16)}
            learner.publish(version, state)
        assert asyncio.run(replica.newer_than(0)) and not asyncio.run(replica.newer_than(2))
        version, source = asyncio.run(replica.fetch(0))
        src = source["collective"]
        assert version == 2 and src["version"] == 2 and len(src["buckets"]) == 2  # 1.2 MB, 1 MiB buckets
        got = dict(receive(src, 0))
        assert got.keys() == state.keys()
        for k, v in state.items():
            assert got[k].dtype == v.dtype and torch.equal(got[k], v), k
        assert not wdir.exists()  # nothing written
        assert [r.get("error") for r in learner._server.sent] == [None]
    finally:
        learner.stop_serving()
        learner.close()


def test_a_receiver_that_never_joins_fails_only_its_own_transfer():
    from raypost.serve.collective import WeightServer, receive, request

    server = WeightServer("127.0.0.1", timeout_s=2.0, ticket_wait_s=0.5)
    try:
        with pytest.raises(RuntimeError, match="before the first version was offered"):
            request(server.address, workers=1)  # answered at once, not at the replica's timeout
        state = {"w": torch.arange(6.0)}
        server.offer(7, state)
        request(server.address, workers=1)  # its worker never joins: the server gives up after 2 s
        import torch.distributed as dist
        from datetime import timedelta

        store = dist.TCPStore("127.0.0.1", server.address["port"], is_master=False, timeout=timedelta(seconds=5))
        store.add("ticket", 1)  # a ticket taken by a replica that died before filing it: skipped
        src = request(server.address, workers=1)
        assert src["version"] == 7 and torch.equal(dict(receive(src, 0))["w"], state["w"])
        assert ["error" in r for r in server.sent] == [True, True, False]
    finally:
        server.stop()
