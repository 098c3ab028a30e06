"""The reward endpoint under hostile traffic: 16 clients over real HTTP (127.0.0.1) mixing labelled
and unlabelled requests, pathological texts (64k characters of whitespace, "the answer is" followed
by whitespace, symbolic answers for math-verify) and bodies it can't parse (JSON nested 50,000
deep, bytes that are not JSON). Every answer is checked against the reward derived by hand for its
request (``CASES``); a wrong reward, a 5xx or a missing answer counts against it.

    .venv/bin/python -m benchmarks.reward_boundary [--clients 16] [--seconds 30]

Writes benchmarks/out/reward_boundary.json: requests, wrong rewards, 5xx, p50/p99 latency of
the scored requests, and whether /health still answers afterwards.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from typing import Any

import requests

from benchmarks.common import OUT

# accuracy (flexible extraction: '####', \boxed{}, "the answer is", last number) weighs 1.0,
# format ('#### <number>' at the end) 0.1.
SERVICE = {
    "max_text_chars": 70_000,
    "max_body_bytes": 1_000_000,
    "rewards": [
        {"name": "accuracy", "fn": "accuracy", "weight": 1.0, "needs_labels": True, "kwargs": {"extract": "flexible"}},
        {"name": "format", "fn": "format", "weight": 0.1},
    ],
}
WS = " " * 65_536
# (name, request body or raw bytes, expected status, expected rewards), derived by hand.
CASES: list[tuple[str, dict[str, Any] | bytes, int, list[float] | None]] = [
    ("right", {"prompts": ["q"], "completions": ["3 + 4 = 7\n#### 7"], "labels": ["7"]}, 200, [1.1]),
    ("wrong", {"prompts": ["q"], "completions": ["#### 8"], "labels": ["7"]}, 200, [0.1]),
    ("symbolic", {"prompts": ["q"], "completions": ["#### 0.5"], "labels": ["1/2"]}, 200, [1.1]),
    ("phrase", {"prompts": ["q"], "completions": ["So the answer is 7."], "labels": ["7"]}, 200, [1.0]),
    ("whitespace", {"prompts": ["q"], "completions": [WS], "labels": ["7"]}, 200, [0.0]),
    (
        "answer-is-ws",
        {"prompts": ["q"], "completions": ["the answer is" + WS[:60_000] + "x"], "labels": ["7"]},
        200,
        [0.0],
    ),
    ("hashes-ws", {"prompts": ["q"], "completions": ["####" + WS[:60_000] + "#"], "labels": ["7"]}, 200, [0.0]),
    ("unlabelled", {"prompts": ["q", "r"], "completions": ["#### 7", "7"], "rewards": ["format"]}, 200, [0.1, 0.0]),
    ("nested", b"[" * 50_000 + b"]" * 50_000, 400, None),
    ("not-json", b"\xff\xfe{", 400, None),
]


def check(resp: requests.Response, status: int, rewards: list[float] | None) -> str | None:
    """None when the answer is the expected one; else what was wrong."""
    if resp.status_code >= 500:
        return f"5xx: {resp.status_code} {resp.text[:200]}"
    if resp.status_code != status:
        return f"status {resp.status_code}, expected {status}: {resp.text[:200]}"
    if rewards is not None:
        got = resp.json()["rewards"]
        if len(got) != len(rewards) or any(abs(a - b) > 1e-6 for a, b in zip(got, rewards)):
            return f"rewards {got}, expected {rewards}"
    return None


def load(url: str, token: str, clients: int, seconds: float) -> dict[str, Any]:
    """``clients`` threads, each cycling through CASES (from its own offset) for ``seconds``."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    bodies = [(n, b if isinstance(b, bytes) else json.dumps(b).encode(), s, r) for n, b, s, r in CASES]
    lat: list[float] = []
    failures: list[dict[str, Any]] = []
    counts = {"requests": 0, "5xx": 0, "wrong": 0, "transport_errors": 0}
    lock = threading.Lock()
    stop = time.time() + seconds

    def client(offset: int) -> None:
        s, i = requests.Session(), offset
        while time.time() < stop:
            name, body, status, rewards = bodies[i % len(bodies)]
            i += 1
            t0 = time.perf_counter()
            try:
                problem = check(s.post(url, data=body, headers=headers, timeout=30), status, rewards)
            except requests.RequestException as err:
                problem = f"transport: {err}"
            dt = time.perf_counter() - t0
            with lock:
                counts["requests"] += 1
                if problem is None and status == 200:
                    lat.append(dt)
                elif problem is not None:
                    key = (
                        "5xx"
                        if problem.startswith("5xx")
                        else "transport_errors"
                        if "transport" in problem
                        else "wrong"
                    )
                    counts[key] += 1
                    failures.append({"case": name, "problem": problem})

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    q = statistics.quantiles(lat, n=100) if len(lat) > 1 else [float("nan")] * 99
    return {**counts, "scored": len(lat), "p50_ms": 1000 * q[49], "p99_ms": 1000 * q[98], "failures": failures[:20]}


def serve_and_load(port: int, token: str, clients: int, seconds: float, cpus: float = 1.0) -> dict[str, Any]:
    """Deploy the reward app (SERVICE, behind ``token``) on the running Serve, load it, check that
    it still answers /health, and remove it."""
    from ray import serve

    from raypost.config import build
    from raypost.config.serve import RewardServiceConfig
    from raypost.serve.reward_app import build_app

    cfg = build(RewardServiceConfig, {**SERVICE, "auth_token": token, "cpus_per_replica": cpus})
    serve.run(build_app(cfg), name="reward-boundary", route_prefix="/boundary")
    try:
        out = load(f"http://127.0.0.1:{port}/boundary/v1/rewards", token, clients, seconds)
        health = requests.get(
            f"http://127.0.0.1:{port}/boundary/health", headers={"Authorization": f"Bearer {token}"}, timeout=10
        )
        return {**out, "healthy_after": health.status_code == 200}
    finally:
        serve.delete("reward-boundary")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=30)
    args = ap.parse_args()

    import secrets

    import ray
    from ray import serve

    from benchmarks.reward_load import free_port

    ray.init(include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    result = serve_and_load(port, secrets.token_hex(16), args.clients, args.seconds)
    serve.shutdown()
    ray.shutdown()
    print(json.dumps({k: v for k, v in result.items() if k != "failures"}, indent=2))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "reward_boundary.json").write_text(json.dumps({"args": vars(args), "result": result}, indent=2))


if __name__ == "__main__":
    main()
