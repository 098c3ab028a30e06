"""Load on the reward endpoint over real HTTP (127.0.0.1): N concurrent clients for a fixed
time, each POSTing /v1/rewards with ``--items`` (prompt, completion, label) items.

    .venv/bin/python -m benchmarks.reward_load [--clients 1 8 32] [--seconds 30] [--replicas 1 2]
                                               [--autoscale] [--items 4] [--model RM_PATH]
                                               [--batching 16:0.005 64:0.005 64:0.02]

Reports requests/s, p50/p99 latency and errors per (setup, clients); prints a table and
writes benchmarks/out/reward_load.json. ``--model`` adds a reward model (e.g. the MiniLM one
``pipelines/reward_model.py`` trains) to the verifiers, which is where batching matters;
``--batching`` first compares serve.batch settings (max_batch_size:batch_wait_timeout_s) on
one replica at the largest client count. Traffic goes to loopback only and stops by itself.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import threading
import time
from typing import Any

import requests

from benchmarks.common import OUT, table


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load(url: str, clients: int, seconds: float, items: int) -> dict:
    body = json.dumps(
        {
            "prompts": ["Ava has 3 pens. She buys 4 more. How many pens?"] * items,
            "completions": ["3 + 4 = 7\n#### 7"] * items,
            "labels": ["7"] * items,
        }
    ).encode()
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    stop = time.time() + seconds

    def client() -> None:
        s = requests.Session()
        while time.time() < stop:
            t0 = time.perf_counter()
            try:
                r = s.post(url, data=body, headers={"Content-Type": "application/json"}, timeout=30)
                ok = r.status_code == 200 and len(r.json()["rewards"]) == items
            except requests.RequestException:
                ok = False
            dt = time.perf_counter() - t0
            with lock:
                latencies.append(dt) if ok else None
                errors[0] += 0 if ok else 1

    threads = [threading.Thread(target=client) for _ in range(clients)]
    t0 = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.time() - t0
    q = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [float("nan")] * 99
    return {
        "requests": len(latencies) + errors[0],
        "errors": errors[0],
        "rps": len(latencies) / wall,
        "p50_ms": 1000 * q[49],
        "p99_ms": 1000 * q[98],
    }


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--replicas", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--autoscale", action="store_true", help="also run with Serve autoscaling (1..max replicas)")
    ap.add_argument("--items", type=int, default=4)
    ap.add_argument("--max-batch-size", type=int, default=32)
    ap.add_argument("--batch-wait-timeout-s", type=float, default=0.005)
    ap.add_argument("--model", default=None, help="reward model (sequence classifier) served with the verifiers")
    ap.add_argument("--batching", nargs="*", default=[], help="SIZE:WAIT serve.batch settings to compare first")
    return ap.parse_args()


def setups(args: argparse.Namespace) -> list[tuple[str, dict[str, Any]]]:
    """(row label, reward-service config overrides) of every setup to measure."""
    out = []
    for b in args.batching:
        size, wait = b.split(":")
        out.append(
            (
                f"1 replica, batch {b}",
                {"num_replicas": 1, "max_batch_size": int(size), "batch_wait_timeout_s": float(wait)},
            )
        )
    out += [(f"{r} replica(s)", {"num_replicas": r}) for r in args.replicas]
    if args.autoscale:
        top = max(args.replicas)
        out.append((f"autoscale 1..{top}", {"autoscale_max_replicas": top, "target_ongoing_requests": 4}))
    return out


def measure(args: argparse.Namespace, port: int) -> list[dict[str, Any]]:
    """Each setup deployed in turn as the "reward" app, loaded by each client count."""
    from ray import serve

    from raypost.config import build
    from raypost.config.serve import RewardServiceConfig
    from raypost.serve.reward_app import build_app

    results = []
    cpus = max(0.25, (os.cpu_count() or 2) / (2 * max(args.replicas)))
    model = {"model": {"path": args.model, "name": "rm", "max_length": 256}} if args.model else {}
    for label, extra in setups(args):
        cfg = build(
            RewardServiceConfig,
            {
                "cpus_per_replica": cpus,
                "max_batch_size": args.max_batch_size,
                "batch_wait_timeout_s": args.batch_wait_timeout_s,
                **model,
                **extra,
            },
        )
        serve.run(build_app(cfg), name="reward", route_prefix="/")
        for n in [max(args.clients)] if label.startswith("1 replica, batch") else args.clients:
            url = f"http://127.0.0.1:{port}/v1/rewards"
            results.append({"setup": label, "clients": n, **load(url, n, args.seconds, args.items)})
        serve.delete("reward")
    return results


def main() -> None:
    args = parse_args()

    import ray
    from ray import serve

    ray.init(include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    results = measure(args, port)
    serve.shutdown()
    ray.shutdown()
    rows = [
        [
            r["setup"],
            r["clients"],
            r["requests"],
            r["errors"],
            f"{r['rps']:.1f}",
            f"{r['p50_ms']:.1f}",
            f"{r['p99_ms']:.1f}",
        ]
        for r in results
    ]
    title = (
        f"\nreward endpoint load, {args.items} items/request, {args.seconds:.0f} s per row, reward model: "
        f"{args.model or 'none'}; replica rows: max_batch_size {args.max_batch_size}, "
        f"batch_wait_timeout_s {args.batch_wait_timeout_s}"
    )
    print(table(title, ["setup", "clients", "requests", "errors", "req/s", "p50 ms", "p99 ms"], rows))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "reward_load.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=2))


if __name__ == "__main__":
    main()
