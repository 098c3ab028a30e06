"""The weight channels on a real Ray cluster: the version record is the run's board actor, not a
file; a shm version whose file this node cannot read is an error that names the fix; the
collective channel streams the newest version in buckets over a gloo group, and a receiver that
never joins fails only its own transfer; an object_store replica hands its engine a memfd."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import ray
import torch

from tests.conftest import ROOT


def channel(transport: str, key: str, **opts):
    """A ``transport`` channel of run ``key``; shm's folder is /dev/shm/<key>."""
    from raypost.config.weights import CollectiveWeights, ObjectStoreWeights, ShmWeights
    from raypost.weights import TRANSPORTS

    settings = {
        "shm": ShmWeights(dir="/dev/shm"),
        "object_store": ObjectStoreWeights(),
        "collective": CollectiveWeights(),
    }
    return TRANSPORTS[transport](settings[transport], key, **opts)


def test_shm_versions_are_recorded_in_ray_and_removed_at_close(ray_cluster):
    import ray

    from raypost.weights import NAMESPACE, WeightsNotReachedError

    key = f"raypost-test-{uuid.uuid4().hex[:8]}"
    wdir = Path("/dev/shm") / key
    learner, replica = channel("shm", key), channel("shm", key)
    try:
        assert asyncio.run(replica.fetch(0)) == (0, None)  # nothing published: no board yet
        for version in (1, 2, 3):
            learner.publish(version, {"w": torch.full((4,), float(version))})
        version, source = asyncio.run(replica.fetch(0))
        assert version == 3 and Path(source["file"]) == wdir / "v3.safetensors"
        assert asyncio.run(replica.fetch(3)) == (3, None)  # already served
        # The record is the board; the folder holds only the last two versions' files.
        assert sorted(p.name for p in wdir.iterdir()) == ["v2.safetensors", "v3.safetensors"]
        board = ray.get_actor(learner.board_name, namespace=NAMESPACE)
        assert ray.get(board.latest.remote())[0] == 3
        # A replica on another node than learner rank 0 finds the record but not the file.
        (wdir / "v3.safetensors").unlink()
        (wdir / "v2.safetensors").unlink()
        with pytest.raises(WeightsNotReachedError, match="rollout.weights.transport=object_store"):
            asyncio.run(channel("shm", key).fetch(0))
    finally:
        learner.close()
    with pytest.raises(ValueError):
        ray.get_actor(learner.board_name, namespace=NAMESPACE)
    assert not wdir.exists()


def test_shm_files_are_removed_on_the_node_that_holds_them(ray_cluster, monkeypatch):
    """The run ends on the driver's node, but the version files are on learner rank 0's: close()
    removes them there (here the caller pretends to be on another node, so only the task that
    runs on the recorded node can remove them)."""
    from raypost.weights import shm

    key = f"raypost-test-{uuid.uuid4().hex[:8]}"
    learner = channel("shm", key)
    learner.publish(1, {"w": torch.ones(4)})
    assert (Path("/dev/shm") / key / "v1.safetensors").is_file()
    monkeypatch.setattr(shm, "this_node", lambda: "a-node-without-the-files")
    monkeypatch.setattr(shm.shutil, "rmtree", lambda *a, **k: None)  # this process removes nothing
    learner.close()
    assert not (Path("/dev/shm") / key).exists()
    with pytest.raises(ValueError):  # close() returns once the board's name is free for a next run
        ray.get_actor(learner.board_name, namespace="raypost")


def test_buckets_hold_whole_tensors_up_to_the_bucket_size():
    from raypost.weights.collective import buckets_of

    # (name, dtype, shape, offset, bytes) as memfd.layout lays them out
    meta = [
        ("a", "float32", [4], 0, 16),
        ("b", "float32", [4], 16, 16),
        ("c", "float32", [16], 32, 64),
        ("d", "float32", [2], 96, 8),
    ]
    assert buckets_of(meta, 32) == [(0, 32), (32, 96), (96, 104)]  # c alone: larger than a bucket
    assert buckets_of(meta, 1000) == [(0, 104)]
    assert buckets_of([], 32) == []


def test_collective_channel_streams_the_newest_version_in_buckets(ray_cluster):
    from raypost.weights.collective import receive

    key = f"raypost-test-{uuid.uuid4().hex[:8]}"
    learner, replica = channel("collective", key, bucket_mb=1), channel("collective", key)
    g = torch.Generator().manual_seed(0)
    try:
        assert asyncio.run(replica.fetch(0)) == (0, None)
        for version in (1, 2):
            state = {
                "embed": torch.randn(300, 1024, generator=g),
                "norm": torch.randn(8, generator=g),
                "half": torch.randn(64, 64, generator=g).to(torch.bfloat16),
            }
            learner.publish(version, state)
        assert asyncio.run(replica.newer_than(0)) and not asyncio.run(replica.newer_than(2))
        version, source = asyncio.run(replica.fetch(0))
        src = source
        assert version == 2 and src["version"] == 2 and len(src["buckets"]) == 2  # 1.2 MB, 1 MiB buckets
        got = dict(receive(src, 0))
        assert got.keys() == state.keys()
        for k, v in state.items():
            assert got[k].dtype == v.dtype and torch.equal(got[k], v), k
        assert not (Path("/dev/shm") / key).exists()  # nothing written
        assert [r.get("error") for r in learner._server.sent] == [None]
    finally:
        learner.stop_serving()
        learner.close()


def test_a_receiver_that_never_joins_fails_only_its_own_transfer():
    from raypost.weights import specs_of
    from raypost.weights.collective import WeightServer, receive, request

    server = WeightServer("127.0.0.1", timeout_s=2.0, ticket_wait_s=0.5)
    try:
        with pytest.raises(RuntimeError, match="before the first version was offered"):
            request(server.address, workers=1)  # answered at once, not at the replica's timeout
        state = {"w": torch.arange(6.0)}
        server.offer(7, specs_of(state), [state])
        request(server.address, workers=1)  # its worker never joins: the server gives up after 2 s
        from datetime import timedelta

        import torch.distributed as dist

        store = dist.TCPStore("127.0.0.1", server.address["port"], is_master=False, timeout=timedelta(seconds=5))
        store.add("ticket", 1)  # a ticket taken by a replica that died before filing it: skipped
        src = request(server.address, workers=1)
        assert src["version"] == 7 and torch.equal(dict(receive(src, 0))["w"], state["w"])
        server.stop()  # waits for the stalled transfer's end
        assert [(r["ticket"], "error" in r) for r in sorted(server.sent, key=lambda r: r["ticket"])] == [
            (1, True),
            (2, True),
            (4, False),
        ]
    finally:
        server.stop()


def test_the_weight_server_refills_an_old_buffer_only_when_no_transfer_sends_it():
    from raypost.weights import specs_of
    from raypost.weights.collective import WeightServer, receive, request

    def state(v: int) -> dict[str, torch.Tensor]:
        return {"w": torch.full((1000,), float(v)), "h": torch.full((3,), float(v)).to(torch.bfloat16)}

    server = WeightServer("127.0.0.1", timeout_s=3.0)
    buf = {}
    try:
        for v in (1, 2, 3):
            server.offer(v, specs_of(state(v)), [state(v)])
            buf[v] = server._offer["buf"].data_ptr()
        assert buf[3] == buf[1] != buf[2]  # nothing sent version 1: its buffer holds version 3
        # A transfer of version 3 is in flight (its worker never joins; the server gives up after
        # 3 s). request() returns once the server has started it. Versions 4 and 5 leave its buffer alone.
        request(server.address, workers=1)
        for v in (4, 5):
            server.offer(v, specs_of(state(v)), [state(v)])
            buf[v] = server._offer["buf"].data_ptr()
        assert buf[4] == buf[2] and buf[3] not in (buf[4], buf[5])
        src = request(server.address, workers=1)  # served beside the stalled transfer
        got = dict(receive(src, 0))
        assert src["version"] == 5 and all(torch.equal(got[k], t) for k, t in state(5).items())
        server.stop()  # waits for the stalled transfer's end
        assert sorted((r["version"], "error" in r) for r in server.sent) == [(3, True), (5, False)]
    finally:
        server.stop()


def test_a_streamed_file_is_the_safetensors_file_of_its_buckets_or_nothing(tmp_path):
    from safetensors import safe_open

    from raypost.weights import shm as weights

    g = torch.Generator().manual_seed(0)
    state = {
        "a": torch.randn(3, 4, generator=g),
        "half": torch.randn(5, generator=g).to(torch.bfloat16),
        "step": torch.tensor(3),
        "empty": torch.zeros(0, 2),
    }
    specs = weights.specs_of(state)
    files = weights.VersionFiles(tmp_path)
    path = files.write(
        1, specs, [{"a": state["a"]}, {"half": state["half"], "step": state["step"]}, {"empty": state["empty"]}]
    )
    with safe_open(str(path), "pt") as f:  # what the replica's engine workers read
        assert list(f.keys()) == sorted(state)
        for k, v in state.items():
            got = f.get_tensor(k)
            assert got.dtype == v.dtype and torch.equal(got, v), k
    # A stream out of order, or one that stops early, leaves no file (not even the partial one).
    with pytest.raises(ValueError, match="out of order"):
        files.write(2, specs, [{"half": state["half"]}])
    with pytest.raises(ValueError, match="ended before its last tensor"):
        files.write(2, specs, [{"a": state["a"]}])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v1.safetensors"]


def test_an_old_version_file_is_rewritten_in_place_only_when_no_reader_holds_it(tmp_path):
    from safetensors.torch import load_file

    from raypost.weights import shm as weights

    def state(v: float) -> dict[str, torch.Tensor]:
        return {"w": torch.full((64, 64), v), "h": torch.full((7,), v).to(torch.bfloat16)}

    files = weights.VersionFiles(tmp_path)
    inode = {v: files.publish(v, state(v)).stat().st_ino for v in (1, 2)}
    # Version 3 takes version 1's file (no reader holds it): the same inode, its own bytes.
    path3 = files.publish(3, state(3))
    assert path3.stat().st_ino == inode[1]
    assert all(torch.equal(t, state(3)[k]) for k, t in load_file(str(path3)).items())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v2.safetensors", "v3.safetensors"]
    # A reader holds version 2 (as an engine worker does while it loads): version 4 leaves its
    # bytes alone and writes a new file; the reader still reads version 2.
    with weights.reading(tmp_path / "v2.safetensors") as held:
        path4 = files.publish(4, {"w": torch.full((128, 64), 4.0), "h": state(4)["h"]})
        inode[4] = path4.stat().st_ino
        assert inode[4] != inode[2] and not (tmp_path / "v2.safetensors").exists()
        assert all(torch.equal(t, state(2)[k]) for k, t in load_file(held).items())
    assert load_file(str(path4))["w"].shape == (128, 64) and load_file(str(path4))["w"].eq(4).all()
    # A file taken for a newer version is not read as its old one: the reader is told it is gone.
    files.publish(5, state(5))  # takes version 3's file
    with pytest.raises(FileNotFoundError), weights.reading(path3):
        pass
    # the engine worker's reader holds the file as it reads
    read = weights.ShmChannel.tensors({"transport": "shm", "file": str(tmp_path / "v5.safetensors")}, None)
    assert {k: v.eq(5).all().item() for k, v in read} == {"w": True, "h": True}
    # Version 6 takes version 4's larger file and shrinks it. The writer maps only the files that
    # exist (a mapping of a deleted one would keep its memory), and none after close.
    path6 = files.publish(6, state(6))
    assert path6.stat().st_ino == inode[4]
    assert path6.stat().st_size == (tmp_path / "v5.safetensors").stat().st_size
    assert all(torch.equal(t, state(6)[k]) for k, t in load_file(str(path6)).items())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v5.safetensors", "v6.safetensors"]
    assert _mapped_under(tmp_path) == {str(tmp_path / "v5.safetensors"), str(path6)}
    files.close()
    assert _mapped_under(tmp_path) == set()


def _mapped_under(folder: Path) -> set[str]:
    """The files under ``folder`` this process maps (a deleted one shows as '<path> (deleted)')."""
    lines = Path("/proc/self/maps").read_text().splitlines()
    return {line.split(maxsplit=5)[5] for line in lines if str(folder) in line}


def test_a_push_reads_the_weights_in_buckets_of_at_most_the_bucket_size(tiny_model):
    """The learner side of a push (``weight_buckets``, here without ZeRO-3; ZeRO-3's gathers are
    checked on 2 ranks by tests/integration/test_learner_equivalence.py): whole tensors, in order, each bucket
    at most the bucket size unless it is one larger tensor, the tied lm_head left out."""
    from types import SimpleNamespace

    from raypost.models.hf import load_causal_lm
    from raypost.weights.buckets import weight_buckets

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


def _memfd_name(fd: int) -> str | None:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except FileNotFoundError:
        return None


READ_IN_ANOTHER_PROCESS = """
import json, sys
from raypost.weights.memfd import tensors
print(json.dumps({k: [str(t.dtype), t.float().reshape(-1).tolist()] for k, t in tensors(json.load(sys.stdin))}))
"""


def test_object_store_channel_hands_a_version_put_in_buckets_to_the_workers_without_a_file(ray_cluster):
    """The learner puts a version in buckets; the replica pulls it once and writes it into a memfd,
    which an engine worker (another process) maps and reads; the next version replaces it."""
    from raypost.weights import specs_of

    key = f"raypost-test-{uuid.uuid4().hex[:8]}"
    learner, replica = channel("object_store", key), channel("object_store", key)
    g = torch.Generator().manual_seed(0)
    # odd sizes and mixed dtypes: every tensor still starts aligned for its dtype
    state = {
        "w0": torch.randn(3, generator=g).to(torch.bfloat16),
        "w1": torch.randn(5, 3, generator=g),
        "step": torch.tensor([7], dtype=torch.int64),
        "w2": torch.randn(2, generator=g).to(torch.float16),
    }
    items = list(state.items())
    try:
        learner.publish_stream(4, specs_of(state), [dict(items[:1]), dict(items[1:])])
        sources = [asyncio.run(replica.fetch(0)) for _ in range(2)]  # a second engine asks: pulled once
        (version, source), (_, again) = sources
        assert version == 4 and again == source and source["version"] == 4
        fd = source["fd"]
        assert _memfd_name(fd).startswith("/memfd:raypost-weights")
        out = subprocess.run(
            [sys.executable, "-c", READ_IN_ANOTHER_PROCESS],
            input=json.dumps(source),
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=120,
            check=True,
        )
        got = json.loads(out.stdout)
        for k, v in state.items():
            assert got[k] == [str(v.dtype), v.float().reshape(-1).tolist()], k
        state = {k: v * 2 for k, v in state.items()}  # version 5, in one bucket: written over version 4
        learner.publish_stream(5, specs_of(state), [state])
        version, source = asyncio.run(replica.fetch(4))
        assert version == 5 and source["fd"] == fd and source["version"] == 5
        out = subprocess.run(
            [sys.executable, "-c", READ_IN_ANOTHER_PROCESS],
            input=json.dumps(source),
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=120,
            check=True,
        )
        assert json.loads(out.stdout)["w1"] == [str(state["w1"].dtype), state["w1"].reshape(-1).tolist()]
        with pytest.raises(ValueError, match="out of order"):
            learner.publish_stream(6, specs_of(state), [dict(items[1:]), dict(items[:1])])
        assert not (Path("/dev/shm") / key).exists()  # no file on either side
    finally:
        replica.release()
        learner.close()
    assert replica._shared is None and not (_memfd_name(fd) or "").startswith("/memfd:raypost")  # closed


def test_a_memfd_version_lays_tensors_out_aligned_and_refuses_bytes_that_do_not_match():
    import numpy as np

    from raypost.weights.memfd import ALIGN, SharedWeights, layout, tensors

    specs = [("a", "bfloat16", [3]), ("b", "float32", [2, 2]), ("c", "int64", [])]
    meta, size = layout(specs)
    assert [m[3] for m in meta] == [0, ALIGN, 2 * ALIGN] and [m[4] for m in meta] == [6, 16, 8] and size == 3 * ALIGN
    state = {
        "a": torch.tensor([1.5, -2.0, 3.0], dtype=torch.bfloat16),
        "b": torch.arange(4.0).reshape(2, 2),
        "c": torch.tensor(9),
    }
    arrays = [v.reshape(-1).view(torch.uint8).numpy() for v in state.values()]
    shared = SharedWeights()
    try:
        shared.write(3, specs, arrays)
        got = dict(tensors(shared.source()))
        assert all(got[k].dtype == v.dtype and torch.equal(got[k], v) for k, v in state.items())
        with pytest.raises(ValueError, match="weight b: 8 bytes, its spec says 16"):
            shared.write(4, specs, [arrays[0], np.zeros(8, dtype=np.uint8), arrays[2]])
        with pytest.raises(RuntimeError, match="no complete weight version"):
            shared.source()  # a write that failed half-way is never handed out
        with pytest.raises(ValueError, match="ended before its last tensor"):
            shared.write(4, specs, arrays[:2])
        shared.write(5, specs[:2], arrays[:2])  # a smaller version: the memfd shrinks to it
        assert shared.source()["size"] == 2 * ALIGN and os.fstat(shared.fd).st_size == 2 * ALIGN
    finally:
        shared.close()
