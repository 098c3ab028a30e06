"""The push drills of ``benchmarks.chaos``: a GRPO job whose only rollout replica is SIGKILLed
while it loads a weight version into its engine, on each transport (``shm``, ``object_store``,
``collective``).

When the kill lands is read off the replica, not guessed from a clock: a watcher tails the
replica's log and kills it the moment it logs "loading weight version N" (N >= 3), which it does
after fetching the version and before its engine's workers read the tensors. The row says whether
the kill landed inside the load: the dead replica logged no "weight version N loaded" and never
acknowledged N on the run's weight board. Then the audit of the other GRPO drills (lost and
duplicated by set difference), the staleness of every step's samples (0: each came from the
version the learner held) and, for every step after the kill, whether the replacement had
acknowledged on the board the version the step's samples came from.
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
import glob, json, os, re, signal, sys, time
import ray
try:
    os.nice(-15)  # scheduled ahead of the busy engine: a tiny model's load takes 10-60 ms
except PermissionError:
    pass
deadline, fh, seen, scanned = time.time() + {timeout}, None, "", 0
while time.time() < deadline:
    if fh is None:  # the replica's stderr, where Serve's logger writes
        found = glob.glob(os.path.join({logs!r}, "worker-*-{pid}.err"))
        fh = open(found[0]) if found else None
    else:
        seen += fh.read()
        new, scanned = seen[max(0, scanned - 200) :], len(seen)
        hits = [int(v) for v in re.findall(r"loading weight version (\\d+)", new) if int(v) >= {min_version}]
        if hits:
            os.kill({pid}, signal.SIGKILL)  # the injected fault
            t_kill, version = time.time(), hits[0]
            break
    time.sleep(0.001)
else:
    print(json.dumps({{"killed": False, "log_found": fh is not None}}))
    sys.exit(0)
time.sleep(2.0)
seen += fh.read()
ray.init(address={address!r}, log_to_driver=False)
acks = ray.get(ray.get_actor({board!r}, namespace="raypost").versions.remote(3600.0), timeout=60)
mine = [v for replica, v in acks.items() if replica in seen]  # the victim's id is on its every log line
print(json.dumps({{"killed": True, "t": t_kill, "version": version, "acked": max(mine, default=0),
                   "victim_acks_found": len(mine), "loaded_logged": f"weight version {{version}} loaded" in seen}}))
"""


def push_drill(root: Path, eta: int, transport: str, min_version: int = 3) -> dict[str, Any]:
    """Kill the only rollout replica inside its load of version ``min_version`` or later."""
    with LocalHead(num_cpus=4) as head:
        _auth_env(head)
        extra = ["--rollout.weights.transport", transport, *eta_args(eta)]
        job = GRPOJob(head, root, f"push-{transport}".replace("_", "-"), 8, extra)
        job_id = job.submit()
        job.wait_step(1, job_id)
        victims = _actor_pids(head, f"ServeReplica:{job.name}-rollout")
        if len(victims) != 1:
            raise RuntimeError(f"expected one live rollout replica, found {victims}")
        log_dir = str(Path(head.temp_dir) / "session_latest" / "logs")
        board = f"raypost-weights:{job.name}"
        code = WATCH.format(
            address=head.address, board=board, logs=log_dir, timeout=300, min_version=min_version, pid=victims[0]
        )
        watch = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, env=head.env(), capture_output=True, text=True, timeout=400
        )
        seen = json.loads((watch.stdout.strip().splitlines() or ["{}"])[-1] or "{}")
        if not seen.get("killed"):
            raise RuntimeError(f"the watcher saw no weight load to kill ({seen}):\n{watch.stderr[-3000:]}")
        step_at_fault = max(r["step"] for r in job.steps_done())
        status, logs = job.wait_done(job_id)
    rows, version = job.steps_done(), seen["version"]
    audit = job.audit(seen["t"], step_at_fault, logs)
    # The first step trained on samples of the killed version: served by the replacement replica.
    after = [r["time"] for r in rows if r["weight_version"] > version]
    return {
        "fault": f"rollout replica kill during a weight load ({transport})",
        "transport": transport,
        "injected": 1,
        "survived": status == "SUCCEEDED",
        "killed_at_version": version,
        # it logged no "loaded" line, and its last acknowledgement on the board is of an older version
        "landed_in_push": not seen["loaded_logged"] and seen["victim_acks_found"] == 1 and seen["acked"] < version,
        "victim_last_ack": seen["acked"],
        **audit,
        "recover_s": round(min(after) - seen["t"], 1) if after else None,
        "staleness_max": max(r["staleness_max"] for r in rows),
        "replicas_on_version_min": min(r["replicas_on_version"] for r in rows if r["weight_version"] > version),
    }
