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
    from raypost.serve.weights import specs_of

    server = WeightServer("127.0.0.1", timeout_s=2.0, ticket_wait_s=0.5)
    try:
        with pytest.raises(RuntimeError, match="before the first version was offered"):
            request(server.address, workers=1)  # answered at once, not at the replica's timeout
        state = {"w": torch.arange(6.0)}
        server.offer(7, specs_of(state), [state])
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


def test_a_streamed_file_is_the_safetensors_file_of_its_buckets_or_nothing(tmp_path):
    from safetensors import safe_open

    from raypost.serve import weights

    g = torch.Generator().manual_seed(0)
    state = {"a": torch.randn(3, 4, generator=g), "half": torch.randn(5, generator=g).to(torch.bfloat16),
             "step": torch.tensor(3), "empty": torch.zeros(0, 2)}
    specs = weights.specs_of(state)
    path = weights.write_stream(tmp_path, 1, specs, [{"a": state["a"]}, {"half": state["half"], "step": state["step"]},
                                                     {"empty": state["empty"]}])
    with safe_open(str(path), "pt") as f:  # what the replica's engine workers read
        assert list(f.keys()) == sorted(state)
        for k, v in state.items():
            got = f.get_tensor(k)
            assert got.dtype == v.dtype and torch.equal(got, v), k
    # A stream out of order, or one that stops early, leaves no file (not even the partial one).
    with pytest.raises(ValueError, match="out of order"):
        weights.write_stream(tmp_path, 2, specs, [{"half": state["half"]}])
    with pytest.raises(ValueError, match="ended before its last tensor"):
        weights.write_stream(tmp_path, 2, specs, [{"a": state["a"]}])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v1.safetensors"]


def test_a_push_reads_the_weights_in_buckets_of_at_most_the_bucket_size(tiny_model):
    """The learner side of a push (``weight_buckets``, here without ZeRO-3; ZeRO-3's gathers are
    checked on 2 ranks by tests/test_learner_equivalence.py): whole tensors, in order, each bucket
    at most the bucket size unless it is one larger tensor, the tied lm_head left out."""
    from types import SimpleNamespace

    from raypost.models.hf import load_causal_lm
    from raypost.train.sync import weight_buckets

    model = load_causal_lm(str(tiny_model))
    state = model.state_dict()
    specs, buckets = weight_buckets(SimpleNamespace(module=model), 0, 16 << 10)
    buckets = list(buckets)
    sizes = [sum(v.numel() * v.element_size() for v in b.values()) for b in buckets]
    assert len(buckets) > 10 and all(n <= 16 << 10 or len(b) == 1 for n, b in zip(sizes, buckets))
    got = {k: v for b in buckets for k, v in b.items()}
    want = [k for k in state if not (model.config.tie_word_embeddings and k == "lm_head.weight")]
    assert [s[0] for s in specs] == list(got) == want
    for k in want:
        assert torch.equal(got[k], state[k]) and got[k].data_ptr() != state[k].data_ptr(), k  # copies


def test_object_store_channel_hands_a_version_put_in_buckets_to_the_workers_without_a_file(ray_cluster):
    from raypost.serve.channel import channel
    from raypost.serve.collective import receive
    from raypost.serve.weights import specs_of

    wdir = Path(f"/dev/shm/raypost-test-{uuid.uuid4().hex[:8]}")
    learner, replica = channel("object_store", wdir), channel("object_store", wdir, bucket_mb=1)
    state = {f"w{i}": torch.full((i + 1, 3), float(i)) for i in range(5)}
    try:
        learner.publish_stream(4, specs_of(state), [dict(list(state.items())[:2]), dict(list(state.items())[2:])])
        for _ in range(2):  # a second engine (or a restarted one) asks again: the replica pulled it once
            version, source = asyncio.run(replica.fetch(0))
            got = dict(receive(source["collective"], 0))  # what the engine's worker does
            assert version == 4 and got.keys() == state.keys()
            assert all(torch.equal(got[k], v) for k, v in state.items())
        assert replica._server.sent[-1]["version"] == 4 and len(replica._server.sent) == 2
        assert not wdir.exists()  # no file on either side
    finally:
        replica.release()
        learner.close()
