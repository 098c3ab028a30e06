"""Weight push time per transport, against a memcpy of the same bytes, side by side in one run.

What is timed is what a push costs between the learner's ``push_weights`` and a replica's engine
holding the new tensors: the learner's ``channel.publish(version, state)``, then the replica's
``channel.fetch`` and the read of the tensors the engine's worker does (``vllm_ext._tensors``).
Each transport publishes an untimed version 0 first, which starts the run's board actor (about
1.5-2 s, once per run). Every copy runs on as many torch threads as the driver's memcpy (the
actors set theirs to the driver's; Ray starts an actor with one).

* memcpy: ``copy_`` of every tensor into tensors of the same shapes that were written once
  before (warm pages: the floor, and what the ratios are against).
* memcpy, fresh pages: the same copy into memory mapped just before (every page faulted in on
  first touch), as a push into a new file or object is. malloc'd tensors can be either, by the
  heap's state, which made a plain memcpy read 0.067 s in some runs and 0.18 s in others.
* shm: publish writes ``v<k>.safetensors`` into /dev/shm (from the third version on, into the
  file of the version two before, through the mapping kept from writing it:
  ``weights.VersionFiles``); the reader is this process.
* object_store, same node / other node: a publisher actor (the learner's rank 0) on node A and
  a fetcher actor (a replica) on node A or on node B, two raylets of this machine
  (``LocalHead.add_node``), so the other-node case goes through Ray's object transfer. The
  fetcher writes the pulled buckets into a memfd and maps it, as its engine's worker would.
* collective, same node / other node: the same actors; the fetcher takes a ticket from the
  publisher's weight server and receives every bucket over a gloo group, as an engine worker
  does (``raypost.weights.collective.receive``). Publish is the learner's copy into the buffer it serves.

  .venv/bin/python -m benchmarks.weight_push                 # tiny model and SmolLM2 (if installed)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.common import OUT, model_for, run_child, table

MARK = "PUSH_BENCH "


def load_state(model_dir: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(next(Path(model_dir).glob("*.safetensors"))))


def read_tensors(source: dict[str, Any]) -> int:
    """What the engine's worker does with a pushed version (``engine_tensors``): every tensor read."""
    from raypost.weights.channel import engine_tensors

    return sum(t.numel() * t.element_size() for _, t in engine_tensors(source, None))


def bench_channel(transport: str, key: str) -> Any:
    """The ``transport`` channel of run ``key``, as a run's config opens it."""
    from raypost.config.serve import RolloutConfig
    from raypost.weights import open_channel

    return open_channel(RolloutConfig(weights={"transport": transport}), key)


def time_memcpy(state: dict[str, Any]) -> tuple[float, float]:
    """(warm, fresh): seconds to copy every tensor into warm pages, and into fresh ones."""
    import mmap

    import torch

    dst = {k: torch.empty_like(v) for k, v in state.items()}
    for k, v in state.items():
        dst[k].copy_(v)  # every page written once
    t0 = time.perf_counter()
    for k, v in state.items():
        dst[k].copy_(v)
    warm = time.perf_counter() - t0
    nbytes = sum(v.numel() * v.element_size() for v in state.values())
    region = mmap.mmap(-1, nbytes)  # anonymous: no page is backed until it is touched
    flat = torch.frombuffer(region, dtype=torch.uint8)
    t0, offset = time.perf_counter(), 0
    for v in state.values():
        n = v.numel() * v.element_size()
        flat[offset : offset + n].view(v.dtype).copy_(v.reshape(-1))
        offset += n
    fresh = time.perf_counter() - t0
    del flat
    region.close()
    return warm, fresh


def time_shm(state: dict[str, Any], repeats: int) -> list[tuple[float, float]]:
    """(publish, publish + read) per version, after an untimed version 0 that starts the run's board."""
    chan = bench_channel("shm", f"bench-{uuid.uuid4().hex[:8]}")
    out = []
    try:
        for version in range(repeats + 1):
            t0 = time.perf_counter()
            chan.publish(version, state)
            t1 = time.perf_counter()
            _, source = asyncio.run(chan.fetch(-1))
            read_tensors(source)
            out.append((t1 - t0, time.perf_counter() - t0))
        return out[1:]
    finally:
        chan.close()


class Publisher:
    """The learner's rank 0: holds the state and publishes it (the object is owned here)."""

    def __init__(self, model_dir: str, key: str, transport: str, threads: int) -> None:
        import torch

        torch.set_num_threads(threads)  # as the driver's memcpy has (Ray starts an actor with 1)
        self.state = load_state(Path(model_dir))
        self.chan = bench_channel(transport, key)

    def publish(self, version: int) -> float:
        t0 = time.perf_counter()
        self.chan.publish(version, self.state)
        return time.perf_counter() - t0

    def put_alone(self) -> float:
        """Seconds of one ``ray.put`` of the whole version's bytes, already in one array: the copy
        into the object store that object_store's publish cannot avoid (its pack is a copy more)."""
        import numpy as np
        import ray
        import torch

        flat = np.concatenate([t.contiguous().reshape(-1).view(torch.uint8).numpy() for t in self.state.values()])
        held = []
        for _ in range(3):  # the object store's pages for it faulted in, as they are in a run's steady state
            held = [*held, ray.put(flat)][-2:]
        t0 = time.perf_counter()
        held.append(ray.put(flat))
        return time.perf_counter() - t0

    def close(self) -> None:
        self.chan.stop_serving()
        self.chan.close()


class Fetcher:
    """A replica: fetch the newest version, then read it as the worker does (object_store: map the
    memfd the replica wrote the pulled objects into; collective: receive every bucket from the
    learner's server)."""

    def __init__(self, key: str, transport: str, threads: int) -> None:
        import torch

        torch.set_num_threads(threads)
        self.chan = bench_channel(transport, key)
        self.have = 0

    async def fetch(self) -> float:
        t0 = time.perf_counter()
        self.have, source = await self.chan.fetch(self.have)
        await asyncio.to_thread(read_tensors, source)  # as the engine's worker reads it (from this process here)
        return time.perf_counter() - t0

    def release(self) -> None:
        self.chan.release()


def time_across_nodes(
    address: str, model_dir: Path, repeats: int, transport: str, threads: int
) -> dict[str, list[float]]:
    """In a child process started with the head's environment (its token auth, and 127.0.0.1 kept as
    the address: Ray reads that setting when it is imported)."""
    import ray

    ray.init(address=address, log_to_driver=False)
    key = f"bench-{uuid.uuid4().hex[:8]}"
    on = {node: {"num_cpus": 0, "resources": {node: 0.01}} for node in ("node_a", "node_b")}
    pub = ray.remote(Publisher).options(**on["node_a"]).remote(str(model_dir), key, transport, threads)
    near = ray.remote(Fetcher).options(**on["node_a"]).remote(key, transport, threads)
    far = ray.remote(Fetcher).options(**on["node_b"]).remote(key, transport, threads)
    out: dict[str, list[float]] = {"publish": [], "same node": [], "other node": [], "put alone": []}
    try:
        ray.get(pub.publish.remote(0))  # untimed: starts the run's board (and collective's server)
        for v in range(1, repeats + 1):
            out["publish"].append(ray.get(pub.publish.remote(v)))
            out["same node"].append(out["publish"][-1] + ray.get(near.fetch.remote()))
            out["other node"].append(out["publish"][-1] + ray.get(far.fetch.remote()))
        if transport == "object_store":
            out["put alone"] = [ray.get(pub.put_alone.remote()) for _ in range(repeats)]
    finally:
        ray.get([near.release.remote(), far.release.remote()])
        ray.get(pub.close.remote())
        ray.shutdown()
    return out


def across_nodes_child(head: Any, model_dir: Path, repeats: int, transport: str) -> dict[str, list[float]]:
    import torch

    args = [
        "--ray-child",
        head.address,
        "--model-dir",
        str(model_dir),
        "--repeats",
        str(repeats),
        "--transport",
        transport,
        "--threads",
        str(torch.get_num_threads()),
    ]
    return run_child(Path(__file__), args, base_env=head.env(), timeout=600, mark=MARK)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ray-child", help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    ap.add_argument("--transport", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.ray_child:
        out = time_across_nodes(args.ray_child, Path(args.model_dir), args.repeats, args.transport, args.threads)
        print(MARK + json.dumps(out), flush=True)
        return
    import signal

    from raypost.models import named
    from raypost.utils.local_head import LocalHead

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # the head and its nodes stop on the way out

    models = {"tiny": model_for("tiny")}
    try:
        models["smollm2-135m-instruct"] = Path(named.resolve("smollm2-135m-instruct"))
    except Exception as e:  # noqa: BLE001 - the package is optional here
        print(f"SmolLM2 skipped: {e}")
    import torch

    result: dict[str, Any] = {"repeats": args.repeats, "torch_threads": torch.get_num_threads(), "models": {}}
    rows = []
    with LocalHead(num_cpus=1) as head:
        head.add_node(1, {"node_a": 1})
        head.add_node(1, {"node_b": 1})
        for name, path in models.items():
            state = load_state(path)
            nbytes = sum(t.numel() * t.element_size() for t in state.values())
            copies = [time_memcpy(state) for _ in range(args.repeats)]
            memcpy = statistics.median(c[0] for c in copies)
            shm = time_shm(state, args.repeats)
            med = {
                "memcpy": memcpy,
                "memcpy, fresh pages": statistics.median(c[1] for c in copies),
                "shm publish": statistics.median(s[0] for s in shm),
                "shm publish + read": statistics.median(s[1] for s in shm),
            }
            result["models"][name] = {"bytes": nbytes, "median_s": med, "shm_runs": shm}
            for transport, load in (("object_store", "fetch + read"), ("collective", "receive")):
                runs = across_nodes_child(head, path, args.repeats, transport)
                med.update(
                    {
                        f"{transport} publish": statistics.median(runs["publish"]),
                        f"{transport} same node, publish + {load}": statistics.median(runs["same node"]),
                        f"{transport} other node, publish + {load}": statistics.median(runs["other node"]),
                    }
                )
                if runs["put alone"]:
                    med["ray.put of the packed bytes alone"] = statistics.median(runs["put alone"])
                result["models"][name][f"{transport}_runs"] = runs
            rows += [[name, f"{nbytes / 2**20:.1f}", k, f"{v:.3f}", f"{v / memcpy:.1f}"] for k, v in med.items()]
    print(table(f"weight push, medians of {args.repeats}", ["model", "MiB", "what", "seconds", "x memcpy"], rows))
    OUT.mkdir(exist_ok=True)
    (OUT / "weight_push.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
