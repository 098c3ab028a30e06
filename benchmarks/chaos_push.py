"""The push drills of ``benchmarks.chaos``: a GRPO job whose only rollout replica is SIGKILLed
while it loads a weight version, on each transport (``shm``, ``object_store``, ``collective``).

When the kill lands is read off the run's weight board, not guessed from a clock: a watcher on
the cluster polls the board (newest published version, the version the replica acknowledged)
and kills the replica the moment a version is published that it has not acknowledged yet. The
row says whether the kill landed inside the push: after it, the dead replica's last
acknowledgement is still older than the version published when it died. Then the audit of the
other GRPO drills (lost and duplicated by set difference), and whether the replacement served
the pushed weights: in a synchronous run each step's samples come from the version the learner
holds, so the ratio of the learner's log-probs to the replica's stays at 1 (a replica serving
stale weights under a new label shows as a ratio away from 1).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.chaos_grpo import GRPOJob, _actor_pids, _auth_env, eta_args
from benchmarks.common import ROOT
from raypost.utils.local_head import LocalHead

TRANSPORTS = ("shm", "object_store", "collective")

WATCH = """
import json, os, signal, sys, time
import ray
ray.init(address={address!r}, log_to_driver=False)
deadline, board = time.time() + {timeout}, None
while board is None and time.time() < deadline:
    try:
        board = ray.get_actor({board!r}, namespace="raypost")
    except ValueError:
        time.sleep(0.2)
while board is not None and time.time() < deadline:
    (version, _), acks = ray.get([board.latest.remote(), board.versions.remote(3600.0)], timeout=30)
    if version >= {min_version} and len(acks) == 1 and max(acks.values()) < version:
        os.kill({pid}, signal.SIGKILL)  # the injected fault: a version published, not yet loaded
        t_kill = time.time()
        break
else:
    print(json.dumps({{"killed": False}}))
    sys.exit(0)
(victim,) = acks
time.sleep(5.0)
after = ray.get(board.versions.remote(3600.0), timeout=30)
print(json.dumps({{"killed": True, "t": t_kill, "published": version, "acked_before": acks[victim],
                   "acked_after": after.get(victim)}}))
"""


def push_drill(root: Path, eta: int, transport: str, min_version: int = 3) -> dict[str, Any]:
    """Kill the only rollout replica inside a push of version ``min_version`` or later."""
    with LocalHead(num_cpus=4) as head:
        _auth_env(head)
        extra = ["--rollout.weights.transport", transport, *eta_args(eta)]
        job = GRPOJob(head, root, f"push-{transport}".replace("_", "-"), 8, extra)
        job_id = job.submit()
        job.wait_step(1, job_id)
        victims = _actor_pids(head, f"ServeReplica:{job.name}-rollout")
        if len(victims) != 1:
            raise RuntimeError(f"expected one live rollout replica, found {victims}")
        code = WATCH.format(
            address=head.address,
            board=f"raypost-weights:{job.name}",
            timeout=300,
            min_version=min_version,
            pid=victims[0],
        )
        watch = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, env=head.env(), capture_output=True, text=True, timeout=400
        )
        seen = json.loads((watch.stdout.strip().splitlines() or ["{}"])[-1] or "{}")
        if not seen.get("killed"):
            raise RuntimeError(f"the watcher never saw a push to kill in:\n{watch.stderr[-3000:]}")
        step_at_fault = max(r["step"] for r in job.steps_done())
        status, logs = job.wait_done(job_id)
    rows = job.steps_done()
    return {
        "fault": f"rollout replica kill during a push ({transport})",
        "transport": transport,
        "injected": 1,
        "survived": status == "SUCCEEDED",
        "killed_at_version": seen["published"],
        # the dead replica never acknowledged the version it was loading: the kill was inside the push
        "landed_in_push": (seen["acked_after"] or 0) < seen["published"],
        **job.audit(seen["t"], step_at_fault, logs),
        "staleness_max": max(r["staleness_max"] for r in rows),
        "behav_ratio_dev_max": round(max(abs(r["behav_ratio_mean"] - 1) for r in rows), 4),
    }
