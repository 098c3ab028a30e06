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
  replica   a GRPO job with 2 rollout replicas; one is SIGKILLed mid-run. Serve replaces it,
            in-flight requests are retried on the other, training goes on.
  worker    a GRPO job with run.max_failures 1; a Ray Train worker is SIGKILLed between two
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
For the GRPO drills, a row reports steps lost (trained, then discarded by the restore), samples
duplicated and lost (from trained_samples.jsonl: each step trains prompts_per_step x group_size
samples, all distinct) and the time from the fault to the next trained step.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
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

from benchmarks.common import OUT, ROOT, table
from raypost.utils.local_head import LocalHead, LocalRedis, free_port

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


GRPO_ARGS = [
    "--config",
    "examples/grpo_smoke.yaml",
    "--warmup.enabled",
    "false",
    "--run.wandb_mode",
    "disabled",
    "--rollout.max_attempts",
    "8",
]
PER_STEP = 16  # grpo_smoke: 4 prompts x 4 completions per step


def eta_args(eta: int) -> list[str]:
    return ["--async_rl.eta", str(eta)]


@dataclass
class GRPOJob:
    """One GRPO job on ``head``, its run folder, and what the drill saw."""

    head: LocalHead
    root: Path
    name: str
    steps: int
    extra: list[str] = field(default_factory=list)

    @property
    def run(self) -> Path:
        return self.root / self.name

    def entrypoint(self) -> str:
        args = [
            *GRPO_ARGS,
            "--run.storage_path",
            str(self.root),
            "--run.name",
            self.name,
            "--algo.steps",
            str(self.steps),
            "--rollout.weights_dir",
            f"/dev/shm/raypost-chaos-{self.name}",
            *self.extra,
        ]
        return shlex.join([sys.executable, "pipelines/grpo.py", *args])

    def submit(self) -> str:
        from ray.job_submission import JobSubmissionClient

        return JobSubmissionClient(self.head.dashboard_url).submit_job(
            entrypoint=self.entrypoint(), runtime_env={"working_dir": str(ROOT)}
        )

    def steps_done(self) -> list[dict[str, Any]]:
        path = self.run / "metrics.jsonl"
        rows = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
        return [r for r in rows if r.get("phase") == "grpo"]

    def wait_step(self, step: int, job_id: str | None = None, timeout: float = 600.0) -> float:
        from ray.job_submission import JobSubmissionClient

        deadline, polls = time.time() + timeout, 0
        while time.time() < deadline:
            if any(r["step"] >= step for r in self.steps_done()):
                return time.time()
            polls += 1
            if job_id is not None and polls % 20 == 0:
                client = JobSubmissionClient(self.head.dashboard_url)
                if str(client.get_job_status(job_id).value) in ("FAILED", "STOPPED"):
                    raise RuntimeError(
                        f"{self.name}: job failed before step {step}:\n{client.get_job_logs(job_id)[-3000:]}"
                    )
            time.sleep(0.1)  # steps of the smoke config take about a second
        raise TimeoutError(f"{self.name}: step {step} not reached within {timeout:.0f} s")

    def wait_done(self, job_id: str, timeout: float = 900.0) -> tuple[str, str]:
        from ray.job_submission import JobSubmissionClient

        client, deadline = JobSubmissionClient(self.head.dashboard_url), time.time() + timeout
        while time.time() < deadline:
            status = str(client.get_job_status(job_id).value)
            if status in ("SUCCEEDED", "FAILED", "STOPPED"):
                return status, client.get_job_logs(job_id)
            time.sleep(2.0)
        raise TimeoutError(f"{self.name}: job {job_id} not done within {timeout:.0f} s")

    def audit(self, t_fault: float, step_at_fault: int, logs: str) -> dict[str, Any]:
        """steps lost, samples duplicated / lost, seconds from the fault to the next trained step."""
        trained = [json.loads(x) for x in (self.run / "trained_samples.jsonl").read_text().splitlines()]
        ids = [i for r in trained for i in r["ids"]]
        resumed = [int(m) for m in re.findall(r"resumed at step (\d+)", logs)]
        after = [r["time"] for r in self.steps_done() if r["time"] > t_fault]
        return {
            "steps_ok": [r["step"] for r in trained] == list(range(1, self.steps + 1)),
            "steps_lost": step_at_fault - resumed[-1] if resumed else 0,
            "samples_duplicated": len(ids) - len(set(ids)),
            "samples_lost": self.steps * PER_STEP - len(set(ids)),
            "recover_s": round(after[0] - t_fault, 1) if after else None,
            "rollout_retries": logs.count("rollout request failed"),
        }


def _actor_pids(head: LocalHead, class_prefix: str) -> list[int]:
    """Pids of this head's live actors whose class starts with ``class_prefix`` (by process title)."""
    import psutil

    groups = {head.proc.pid, *(p.pid for p in head.extra_procs)}
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            title = (proc.info["cmdline"] or [""])[0]
            lineage = [proc, *proc.parents()]
            if title.startswith(f"ray::{class_prefix}") and any(os.getpgid(p.pid) in groups for p in lineage):
                found.append(proc.pid)
        except (psutil.NoSuchProcess, ProcessLookupError):
            continue
    return found


def _auth_env(head: LocalHead) -> None:
    """Job-server clients in this process use the head's auth settings."""
    os.environ.update({k: v for k, v in head.env().items() if k != "RAY_ADDRESS"})


def _kill_drill(fault: str, class_prefix: str, extra: list[str], at_step: int, root: Path, eta: int) -> dict[str, Any]:
    """SIGKILL one actor of ``class_prefix`` once the job has trained ``at_step`` steps."""
    with LocalHead(num_cpus=4) as head:
        _auth_env(head)
        job = GRPOJob(head, root, re.sub(r"\W+", "-", fault), 8, [*extra, *eta_args(eta)])
        job_id = job.submit()
        job.wait_step(1, job_id)
        victims = _actor_pids(head, class_prefix)  # found ahead: the kill must land right after at_step
        if not victims:
            raise RuntimeError(f"no live ray::{class_prefix}* process under this head")
        job.wait_step(at_step, job_id)
        os.kill(victims[0], signal.SIGKILL)  # the injected fault
        t_fault = time.time()
        step_at_fault = max(r["step"] for r in job.steps_done())
        status, logs = job.wait_done(job_id)
    return {"fault": fault, "injected": 1, "survived": status == "SUCCEEDED", **job.audit(t_fault, step_at_fault, logs)}


def replica_drill(root: Path, eta: int) -> dict[str, Any]:
    return _kill_drill("rollout replica kill", "ServeReplica:rollout", ["--rollout.num_replicas", "2"], 2, root, eta)


def worker_drill(root: Path, eta: int) -> dict[str, Any]:
    # Checkpoints at steps 3 and 6; the kill lands after step 4, so the steps after 3 are trained again.
    return _kill_drill(
        "trainer worker kill",
        "RayTrainWorker",
        ["--run.max_failures", "1", "--run.checkpoint_every", "3"],
        4,
        root,
        eta,
    )


RESTARTABLE = """
import json, ray
from raypost.utils.cluster import restartable_dead_actors
ray.init(address="{address}", log_to_driver=False)
print(json.dumps(restartable_dead_actors()))
"""


def _restartable_dead_actors(head: LocalHead) -> list[dict[str, Any]]:
    """Actors the head's GCS keeps DEAD but restartable (what a GCS reloading from Redis aborts on)."""
    proc = subprocess.run(
        [sys.executable, "-c", RESTARTABLE.format(address=head.address)],
        cwd=ROOT,
        env=head.env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _serve_recovered(head: LocalHead, app: str) -> bool:
    """Whether the restarted Serve controller rebuilt ``app`` from its checkpoint in the GCS
    store (its log says so), rather than someone deploying it again."""
    logs = Path(head.temp_dir).glob("session_latest/logs/serve/controller_*.log")
    needle = f"Recovering target state for application '{app}' from checkpoint"
    return any(needle in log.read_text(errors="replace") for log in logs)


def resubmit_drill(root: Path, eta: int, fresh_store: bool = False) -> dict[str, Any]:
    """Kill the whole head mid-run; restart it on the same Redis (or, ``fresh_store``, on an
    empty one); the wrapper re-submits. On the same Redis, a reward app deployed before the job,
    outside it, must answer again without being redeployed."""
    with LocalRedis() as redis, LocalRedis() as fresh:
        head = LocalHead(num_cpus=4, redis_address=redis.address, block=False).start()
        _auth_env(head)  # before Ray's job client is first imported: it reads the auth mode then
        from ray.job_submission import JobSubmissionClient

        from raypost.utils.resubmit import submit_until_done

        name = "head-restart-fresh-store" if fresh_store else "head-restart-resubmit"
        # The job's own Serve apps go on the proxy's port 8000 (grpo_smoke's reward.port); the
        # detached reward app was deployed first, so Serve keeps its own http options.
        reward_url = deploy_reward(head, free_port())
        job = GRPOJob(head, root, name, 8, ["--run.checkpoint_every", "2", *eta_args(eta)])
        box: dict[str, Any] = {}
        wrapper = threading.Thread(
            target=lambda: box.update(
                out=submit_until_done(
                    head.dashboard_url, job.entrypoint(), {"working_dir": str(ROOT)}, max_attempts=3, wait_head_s=300
                )
            )
        )
        try:
            wrapper.start()
            job.wait_step(3)
            restartable = _restartable_dead_actors(head)
            step_at_fault = max(r["step"] for r in job.steps_done())
            t_fault = time.time()
            head.crash()  # every process of the head at once: GCS, raylet, dashboard, the job's driver
            if fresh_store:
                head.redis_address = fresh.address
            head.start()
            detached = {}
            if not fresh_store:
                detached = {
                    "detached_reward_back_s": round(wait_answering(reward_url, 300), 1),
                    "detached_reward_from_checkpoint": _serve_recovered(head, "reward-detached"),
                }
            wrapper.join(900)
            out = box["out"]
            logs = JobSubmissionClient(head.dashboard_url).get_job_logs(out.attempts[-1]["job_id"])
        finally:
            head.stop()
    fault = "head restart (fresh GCS store) + resubmit" if fresh_store else "head restart + resubmit"
    row = {
        "fault": fault,
        "injected": 1,
        "survived": out.status == "SUCCEEDED",
        "attempts": len(out.attempts),
        "restartable_dead_actors_at_crash": restartable,
        **detached,
    }
    return {**row, **job.audit(t_fault, step_at_fault, logs)}


def _pin(head: LocalHead, replicas: int) -> None:
    """`python -m raypost.serve.scaling --replicas N`, run as a job on the cluster."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(head.dashboard_url)
    job_id = client.submit_job(
        entrypoint=f"{sys.executable} -m raypost.serve.scaling --replicas {replicas}",
        runtime_env={"working_dir": str(ROOT)},
    )
    deadline = time.time() + 120
    while str(client.get_job_status(job_id).value) not in ("SUCCEEDED", "FAILED", "STOPPED"):
        if time.time() > deadline:
            raise TimeoutError("the scaling command did not finish within 120 s")
        time.sleep(0.5)
    if str(client.get_job_status(job_id).value) != "SUCCEEDED":
        raise RuntimeError(f"the scaling command failed:\n{client.get_job_logs(job_id)[-2000:]}")


def _running_replicas(head: LocalHead) -> int:
    """RUNNING replicas of the rollout deployment, from Serve's REST API on the dashboard."""
    from raypost.utils.resubmit import auth_headers

    req = urllib.request.Request(f"{head.dashboard_url}/api/serve/applications/", headers=auth_headers())
    with urllib.request.urlopen(req, timeout=10) as resp:
        apps = json.loads(resp.read())["applications"]
    deployment = apps.get("rollout", {}).get("deployments", {}).get("RolloutServer", {})
    return sum(r["state"] == "RUNNING" for r in deployment.get("replicas", []))


def _wait_replicas(head: LocalHead, count: int, timeout: float = 300.0) -> float:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if _running_replicas(head) == count:
            return time.time() - t0
        time.sleep(0.5)
    raise TimeoutError(f"rollout did not reach {count} running replicas within {timeout:.0f} s")


def scale_drill(root: Path, eta: int, steps: int = 100) -> dict[str, Any]:
    """1 -> 2 -> 1 rollout replicas from the CLI while GRPO trains (queue-depth target set high,
    so only the pins move it)."""
    extra = [
        "--rollout.autoscale_max_replicas",
        "2",
        "--rollout.target_ongoing_requests",
        "1000",
        "--rollout.downscale_delay_s",
        "0",
        "--rollout.upscale_delay_s",
        "0",
        *eta_args(eta),
    ]
    with LocalHead(num_cpus=4) as head:
        _auth_env(head)
        # long enough to outlast a second vLLM replica's start (~1 min) plus the scale-down
        job = GRPOJob(head, root, "rollout-1-2-1", steps, extra)
        job_id = job.submit()
        job.wait_step(1, job_id)
        t_fault = time.time()
        _pin(head, 2)
        up_s = _wait_replicas(head, 2)
        step_up = max(r["step"] for r in job.steps_done())
        job.wait_step(step_up + 2, job_id)  # trains on two replicas
        _pin(head, 1)
        down_s = _wait_replicas(head, 1)
        status, logs = job.wait_done(job_id)
    rows = job.steps_done()
    return {
        "fault": "rollout 1-2-1",
        "injected": 2,
        "survived": status == "SUCCEEDED",
        **job.audit(t_fault, 0, logs),
        "scale_up_s": round(up_s, 1),
        "scale_down_s": round(down_s, 1),
        "staleness_max": max(r["staleness_max"] for r in rows),
        "behav_ratio_dev_max": round(max(abs(r["behav_ratio_mean"] - 1) for r in rows), 4),
    }


DRILLS = {
    "gcs": lambda a: gcs_drill(a.outage_s),
    "head": lambda a: head_drill(),
    "replica": lambda a: replica_drill(a.root, a.eta),
    "worker": lambda a: worker_drill(a.root, a.eta),
    "resubmit": lambda a: resubmit_drill(a.root, a.eta),
    "resubmit-fresh": lambda a: resubmit_drill(a.root, a.eta, True),
    "scale": lambda a: scale_drill(a.root, a.eta, a.scale_steps),
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
    args = parser.parse_args(argv)
    args.root = args.root or Path(tempfile.mkdtemp(prefix="raypost-chaos-"))
    results = []
    for name in args.drills:
        results.append(DRILLS[name](args))
        print(json.dumps(results[-1]), flush=True)
    grpo = [r for r in results if "fault" in r]
    if grpo:
        cols = ["fault", "injected", "survived", "steps_lost", "samples_duplicated", "samples_lost", "recover_s"]
        print(table("GRPO under faults (grpo_smoke)", cols, [[r.get(c) for c in cols] for r in grpo]))
    OUT.mkdir(exist_ok=True)
    (OUT / "chaos.json").write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
