"""The GRPO recovery drills of ``benchmarks.chaos``: a GRPO job on a local head, one fault
injected into it (a replica or worker kill, a head crash, live scaling), and what survived,
measured against the expected set of trained samples."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT
from raypost.utils.local_head import LocalHead, free_port
from raypost.utils.local_redis import LocalRedis
from raypost.utils.metrics import read_records

GRPO_ARGS = [
    "--config",
    "examples/grpo_smoke.yaml",
    "--warmup.enabled",
    "false",
    "--run.wandb_mode",
    "disabled",
]  # the rollout section at its defaults: one replica, rollout.retry_window_s 300
PROMPTS_PER_STEP, PER_STEP = 4, 16  # grpo_smoke: 4 prompts x 4 completions per step


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
        rows = read_records(path)[0]  # a torn last line (the torn and disk drills) is not a step
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
        """Steps lost, samples duplicated, prompts lost (the first steps x prompts_per_step of the
        order the run recorded when it started, minus the prompts it trained: a resume that skipped
        prompts shows here), seconds from the fault to the next trained step."""
        trained = read_records(self.run / "trained_samples.jsonl")[0]
        ids = [i for r in trained for i in r["ids"]]
        order = json.loads((self.run / "prompt_order.json").read_text())
        expected = set(order[: self.steps * PROMPTS_PER_STEP])
        prompts = {i.split("#")[0] for i in ids}
        resumed = [int(m) for m in re.findall(r"resumed at step (\d+)", logs)]
        after = [r["time"] for r in self.steps_done() if r["time"] > t_fault]
        return {
            "steps_ok": [r["step"] for r in trained] == list(range(1, self.steps + 1)),
            "steps_lost": step_at_fault - resumed[-1] if resumed else 0,
            "samples_duplicated": len(ids) - len(set(ids)),
            "prompts_lost": len(expected - prompts),
            "prompts_unexpected": len(prompts - expected),
            "samples_per_step_ok": all(len(r["ids"]) == PER_STEP for r in trained),
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


def _kill_drill(
    fault: str,
    class_prefix: str,
    extra: list[str],
    at_step: int,
    root: Path,
    eta: int,
    child: str | None = None,
    sig: int = signal.SIGKILL,
) -> dict[str, Any]:
    """Send ``sig`` (SIGKILL; SIGSTOP: a hang) to one actor of ``class_prefix`` once the job has
    trained ``at_step`` steps (or, with ``child``, to its child process of that title: the vLLM
    engine inside a live replica)."""
    with LocalHead(num_cpus=4) as head:
        _auth_env(head)
        job = GRPOJob(head, root, re.sub(r"\W+", "-", fault), 8, [*extra, *eta_args(eta)])
        job_id = job.submit()
        job.wait_step(1, job_id)
        victims = _actor_pids(head, class_prefix.format(run=job.name))  # found ahead: the kill lands after at_step
        if child is not None:
            victims = _children(victims, child)
        if not victims:
            raise RuntimeError(f"no live ray::{class_prefix}* process under this head")
        job.wait_step(at_step, job_id)
        os.kill(victims[0], sig)  # the injected fault
        t_fault = time.time()
        step_at_fault = max(r["step"] for r in job.steps_done())
        status, logs = job.wait_done(job_id)
    return {"fault": fault, "injected": 1, "survived": status == "SUCCEEDED", **job.audit(t_fault, step_at_fault, logs)}


def replica_drill(root: Path, eta: int) -> dict[str, Any]:
    # The only replica: its requests are retried until Serve has replaced it (rollout.retry_window_s).
    return _kill_drill("rollout replica kill", "ServeReplica:{run}-rollout", [], 2, root, eta)


ENGINE = "VLLM::EngineCore"  # the title of a vLLM engine's process, a child of its replica


def engine_drill(root: Path, eta: int) -> dict[str, Any]:
    # The replica lives on with a dead engine: it leaves at the first failed request, Serve replaces it.
    return _kill_drill("vLLM engine kill in a live replica", "ServeReplica:{run}-rollout", [], 2, root, eta, ENGINE)


HANG_TIMEOUT_S = 60  # rollout.request_timeout_s of the hang drill (900 s by default)


def hang_drill(root: Path, eta: int) -> dict[str, Any]:
    # The engine inside the only replica stops (SIGSTOP): its request times out and is retried; the
    # replica fails its health check once a request is past the timeout, and Serve replaces it.
    extra = ["--rollout.request_timeout_s", str(HANG_TIMEOUT_S)]
    out = _kill_drill(
        "vLLM engine hang in a live replica", "ServeReplica:{run}-rollout", extra, 2, root, eta, ENGINE, signal.SIGSTOP
    )
    return {**out, "request_timeout_s": HANG_TIMEOUT_S}


def _children(pids: list[int], title: str) -> list[int]:
    """Pids of the child processes of ``pids`` whose title starts with ``title``."""
    import psutil

    found = []
    for pid in pids:
        for proc in psutil.Process(pid).children(recursive=True):
            if (proc.cmdline() or [""])[0].startswith(title):
                found.append(proc.pid)
    return found


def worker_drill(root: Path, eta: int) -> dict[str, Any]:
    # Checkpoints at steps 3 and 6; the kill lands after step 4, so the steps after 3 are trained again.
    return _kill_drill(
        "trainer worker kill",
        "RayTrainWorker",
        ["--run.checkpoint_every", "3"],  # run.max_failures at its default
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
        from benchmarks.chaos import deploy_reward, wait_answering

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


def _pin(head: LocalHead, app: str, replicas: int) -> None:
    """`python -m raypost.serve.scaling --replicas N`, run as a job on the cluster."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(head.dashboard_url)
    job_id = client.submit_job(
        entrypoint=f"{sys.executable} -m raypost.serve.scaling --app {app} --replicas {replicas}",
        runtime_env={"working_dir": str(ROOT)},
    )
    deadline = time.time() + 120
    while str(client.get_job_status(job_id).value) not in ("SUCCEEDED", "FAILED", "STOPPED"):
        if time.time() > deadline:
            raise TimeoutError("the scaling command did not finish within 120 s")
        time.sleep(0.5)
    if str(client.get_job_status(job_id).value) != "SUCCEEDED":
        raise RuntimeError(f"the scaling command failed:\n{client.get_job_logs(job_id)[-2000:]}")


def _running_replicas(head: LocalHead, app: str) -> int:
    """RUNNING replicas of the rollout deployment, from Serve's REST API on the dashboard."""
    from raypost.utils.resubmit import auth_headers

    req = urllib.request.Request(f"{head.dashboard_url}/api/serve/applications/", headers=auth_headers())
    with urllib.request.urlopen(req, timeout=10) as resp:
        apps = json.loads(resp.read())["applications"]
    deployment = apps.get(app, {}).get("deployments", {}).get("RolloutServer", {})
    return sum(r["state"] == "RUNNING" for r in deployment.get("replicas", []))


def _wait_replicas(head: LocalHead, app: str, count: int, timeout: float = 300.0) -> float:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if _running_replicas(head, app) == count:
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
        _pin(head, f"{job.name}-rollout", 2)
        up_s = _wait_replicas(head, f"{job.name}-rollout", 2)
        step_up = max(r["step"] for r in job.steps_done())
        job.wait_step(step_up + 2, job_id)  # trains on two replicas
        _pin(head, f"{job.name}-rollout", 1)
        down_s = _wait_replicas(head, f"{job.name}-rollout", 1)
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
