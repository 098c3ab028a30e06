"""Recovery drills on a real local cluster: faults injected into running services and jobs.

Each drill starts what it needs (Debian's redis-server, a `ray start --head` with its own temp
dir and ports, Serve apps, jobs), injects one fault, measures, and stops everything it started
by pid or process group. Nothing else on the machine is touched (no `ray stop`).

  python -m benchmarks.chaos                      # every drill; table + benchmarks/out/chaos.json
  python -m benchmarks.chaos --drills gcs head    # a subset

Drills:
  gcs   the reward endpoint under steady HTTP load while only the GCS is down for --outage-s
        seconds (GCS fault tolerance on Redis), then restarted: requests sent vs answered.
  head  a full head restart (every Ray process of the head stopped, then `ray start` again on the
        same Redis): the detached Serve app comes back by itself; time until it answers again.
  replica   a GRPO job with its one rollout replica (the default); it is SIGKILLed mid-run. Serve
            replaces it; the requests it held, and the new ones, are retried until the new
            replica answers (rollout.retry_window_s, 300 s), and training goes on.
  engine    the same job; the vLLM engine process inside its live replica is SIGKILLed. The
            replica leaves at its first failed request, Serve replaces it, requests are retried.
  hang      the same job with rollout.request_timeout_s 60; the engine inside its replica is
            stopped (SIGSTOP). The request times out and is retried, the replica fails its health
            check once a request has run past the timeout, and Serve replaces it.
  worker    a GRPO job (run.max_failures 3, the default); a Ray Train worker is SIGKILLed between two
            checkpoints. The worker group restarts from the checkpoint (step, data cursor,
            weight version) and the logs are rewound to it.
  resubmit  a GRPO job on a head with GCS fault tolerance, beside a detached reward app deployed
            before it; the whole head is killed mid-run and started again on the same Redis, and
            raypost.utils.resubmit re-submits the same command until it succeeds. It resumes from
            the latest checkpoint. The row lists the actors the GCS held DEAD but restartable
            just before the crash (a reloading GCS aborts on them; docs/recovery.md) and whether
            the detached app answered again, rebuilt by Serve from its checkpoint.
  resubmit-fresh  the same, but the head comes back on an empty Redis, as after losing the GCS
            store: the re-submitted job redeploys its Serve apps and resumes from its checkpoint
            on storage.
  scale     a GRPO job with rollout autoscaling (1..2); `python -m raypost.serve.scaling
            --replicas 2`, then `--replicas 1`, while it trains.
  torn      a GRPO job stopped mid-run; a torn last line (an append cut short) is left in both of
            its records; the same command again drops them, says so, and resumes.
  disk      a GRPO job whose run folder is on a small tmpfs (needs root), filled up after its first
            checkpoint: it must fail naming the full disk, not hang; with the space freed, the same
            command resumes from the last whole checkpoint.
  gcs-job   a GRPO job on a head with GCS fault tolerance; only the GCS is down for --outage-s
            seconds, then restarted; the job must finish with nothing lost.
  push-shm, push-object-store, push-collective   a GRPO job on that weight transport; its only
            rollout replica is SIGKILLed the moment it logs that it starts loading a version into
            its engine (benchmarks/chaos_push.py). The replacement must load the newest version
            before its first request.
For the GRPO drills, a row reports steps lost (trained, then discarded by the restore), samples
duplicated (from trained_samples.jsonl: each step trains prompts_per_step x group_size samples,
all distinct), prompts lost (the first steps x prompts_per_step prompt ids of the order the run
recorded when it started, minus the ones it trained: a set difference, not a count) and the time
from the fault to the next trained step. The GRPO jobs run examples/grpo_smoke.yaml at the shipped
defaults except what a drill needs (checkpoint_every, the hang drill's timeout). Each drill runs
--repeats times (3 by default), each in its own run folder; the table shows the worst run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.chaos_grpo import engine_drill, hang_drill, replica_drill, resubmit_drill, scale_drill, worker_drill
from benchmarks.chaos_push import TRANSPORTS as PUSH_TRANSPORTS
from benchmarks.chaos_push import push_drill
from benchmarks.chaos_store import disk_drill, gcs_job_drill, torn_drill
from benchmarks.common import OUT, ROOT, table
from raypost.utils.local_head import LocalHead, free_port
from raypost.utils.local_redis import LocalRedis

DEPLOY = """
import ray
from ray import serve
from raypost.config.serve import RewardServiceConfig
from raypost.serve.reward_app import build_app
ray.init(address="{address}", log_to_driver=False)
serve.start(http_options={{"host": "127.0.0.1", "port": {port}}})
serve.run(build_app(RewardServiceConfig(cpus_per_replica=0.25)), name="{app}", route_prefix="{prefix}")
"""
REQUEST = {
    "query": ["<user>What is 2 + 3?<assistant>2 + 3 = 5\n#### 5"],
    "prompts": ["<user>What is 2 + 3?"],
    "labels": ["5"],
}


@dataclass
class Load:
    """A client thread sending one /get_reward request every ``interval`` seconds."""

    url: str
    interval: float = 0.05
    log: list[tuple[float, bool]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        body = json.dumps(REQUEST).encode()
        while not self._stop.is_set():
            t = time.time()
            self.log.append((t, post_ok(self.url, body)))
            time.sleep(max(0.0, self.interval - (time.time() - t)))

    def __enter__(self) -> Load:
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.thread.join(30)

    def window(self, start: float, end: float) -> tuple[int, int]:
        """Requests sent and answered that started within [start, end)."""
        rows = [ok for t, ok in self.log if start <= t < end]
        return len(rows), sum(rows)


def post_ok(url: str, body: bytes, timeout: float = 10.0) -> bool:
    """True if the endpoint answered with the right score (accuracy 1.0 for the correct answer)."""
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())["scores"]["accuracy"] == [1.0]
    except (OSError, ValueError, KeyError, urllib.error.HTTPError):
        return False


def wait_answering(url: str, timeout: float) -> float:
    """Seconds until the endpoint answers correctly (raises after ``timeout``)."""
    t0, body = time.time(), json.dumps(REQUEST).encode()
    while time.time() - t0 < timeout:
        if post_ok(url, body, timeout=5.0):
            return time.time() - t0
        time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer within {timeout:.0f} s")


def deploy_reward(head: LocalHead, port: int, app: str = "reward-detached", prefix: str = "/detached") -> str:
    """Deploy the reward service from a driver that then exits (the Serve app is detached)."""
    code = DEPLOY.format(address=head.address, port=port, app=app, prefix=prefix)
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=head.env(), check=True, timeout=300, capture_output=True)
    url = f"http://127.0.0.1:{port}{prefix.rstrip('/')}/get_reward"
    wait_answering(url, 120)
    return url


def gcs_drill(outage_s: float, num_cpus: int = 2) -> dict[str, Any]:
    """Reward endpoint availability while only the GCS is down, then after it restarts."""
    with LocalRedis() as redis, LocalHead(num_cpus=num_cpus, redis_address=redis.address, block=False) as head:
        url = deploy_reward(head, free_port())
        with Load(url) as load:
            time.sleep(3.0)
            t_down = time.time()
            spec = head.kill_gcs()
            time.sleep(outage_s)
            t_up = time.time()
            head.restart_gcs(spec)
            time.sleep(5.0)
        sent, answered = load.window(t_down, t_up)
        after_sent, after_answered = load.window(t_up, time.time())
        # The GCS is back: the cluster takes new work (a task needs the GCS to be scheduled).
        probe = subprocess.run(
            [
                sys.executable,
                "-c",
                "import ray; ray.init(log_to_driver=False); print(ray.get(ray.remote(lambda: 7).remote()))",
            ],
            env=head.env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
    return {
        "drill": "gcs",
        "outage_s": outage_s,
        "sent_during_outage": sent,
        "answered_during_outage": answered,
        "sent_after": after_sent,
        "answered_after": after_answered,
        "cluster_schedules_after": probe.stdout.strip().endswith("7"),
    }


def head_drill(num_cpus: int = 2) -> dict[str, Any]:
    """Full head restart on the same Redis: the Serve app redeploys itself."""
    with LocalRedis() as redis:
        head = LocalHead(num_cpus=num_cpus, redis_address=redis.address).start()
        try:
            url = deploy_reward(head, free_port())
            t0 = time.time()
            head.stop()
            down_s = time.time() - t0
            head.start()
            back_s = wait_answering(url, 180)
        finally:
            head.stop()
    return {
        "drill": "head",
        "head_stop_s": round(down_s, 1),
        "serve_back_after_restart_s": round(back_s, 1),
        "survived": True,
    }


DRILLS = {
    "gcs": lambda a: gcs_drill(a.outage_s),
    "head": lambda a: head_drill(),
    "replica": lambda a: replica_drill(a.root, a.eta),
    "engine": lambda a: engine_drill(a.root, a.eta),
    "hang": lambda a: hang_drill(a.root, a.eta),
    "worker": lambda a: worker_drill(a.root, a.eta),
    "resubmit": lambda a: resubmit_drill(a.root, a.eta),
    "resubmit-fresh": lambda a: resubmit_drill(a.root, a.eta, True),
    "scale": lambda a: scale_drill(a.root, a.eta, a.scale_steps),
    "torn": lambda a: torn_drill(a.root, a.eta),
    "disk": lambda a: disk_drill(a.root, a.eta),
    "gcs-job": lambda a: gcs_job_drill(a.root, a.eta, a.outage_s),
    **{f"push-{t}".replace("_", "-"): (lambda a, t=t: push_drill(a.root, a.eta, t)) for t in PUSH_TRANSPORTS},
}


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drills", nargs="+", choices=sorted(DRILLS), default=list(DRILLS))
    parser.add_argument("--outage-s", type=float, default=10.0)
    parser.add_argument("--eta", type=int, default=0, help="async_rl.eta of the GRPO drills (0: synchronous)")
    parser.add_argument(
        "--scale-steps",
        type=int,
        default=100,
        help="steps of the scale drill's job: enough to "
        "outlast a second replica's start-up, at most "
        "100 (one epoch of grpo_smoke's prompts; past it "
        "prompts repeat and count as duplicated)",
    )
    parser.add_argument("--root", type=Path, default=None, help="run folders of the GRPO drills (default: a temp dir)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each drill; the table shows the worst")
    parser.add_argument("--out", type=Path, default=OUT / "chaos.json")
    args = parser.parse_args(argv)
    base = args.root or Path(tempfile.mkdtemp(prefix="raypost-chaos-"))
    results: list[dict[str, Any]] = []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for name in args.drills:
        for k in range(args.repeats):
            args.root = base / f"try{k}"  # a run folder per try: the same name would resume
            try:
                results.append({**DRILLS[name](args), "drill": name, "try": k})
            except Exception as err:  # noqa: BLE001 - a drill that breaks is a failed run, and the rest go on
                results.append({"drill": name, "try": k, "survived": False, "error": f"{type(err).__name__}: {err}"})
            print(json.dumps(results[-1]), flush=True)
            # after every run: a drill session cut short keeps what it measured
            args.out.write_text(json.dumps({"runs": results, "worst": worst_by_drill(results)}, indent=1))
    rows = worst_by_drill(results)
    cols = ["drill", "tries", "survived", "steps_lost", "samples_duplicated", "prompts_lost", "recover_s"]
    print(table(f"worst of {args.repeats} runs per drill", cols, [[r.get(c) for c in cols] for r in rows]))
    return results


WORST_MAX = (
    "steps_lost",
    "samples_duplicated",
    "prompts_lost",
    "prompts_unexpected",
    "recover_s",
    "rollout_retries",
    "staleness_max",
)


def worst_by_drill(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per drill: every run survived (all of them), and the largest of each loss and delay."""
    out = []
    for name in dict.fromkeys(r["drill"] for r in results):
        runs = [r for r in results if r["drill"] == name]
        survived = all(r.get("survived", True) for r in runs)
        row: dict[str, Any] = {"drill": name, "tries": len(runs), "survived": survived}
        for key in WORST_MAX:
            values = [r[key] for r in runs if r.get(key) is not None]
            if values:
                row[key] = max(values)
        if any("landed_in_push" in r for r in runs):
            row["landed_in_push"] = sum(bool(r.get("landed_in_push")) for r in runs)
        if name == "gcs":
            row["survived"] = all(r["answered_during_outage"] == r["sent_during_outage"] for r in runs)
        out.append(row)
    return out


if __name__ == "__main__":
    main()
