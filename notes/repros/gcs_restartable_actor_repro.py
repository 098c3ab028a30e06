"""Minimal reproduction, without raypost: a restarted GCS aborts on the same Redis when the actor
table holds a DEAD actor that is still restartable (dropped by handle while an object it made is
still referenced, kept by the GCS for lineage reconstruction).

Each case:
  1. starts Debian's redis-server and `ray start --head` with RAY_REDIS_ADDRESS (GCS fault
     tolerance), each in its own process group, temp dir and free ports;
  2. runs a driver that creates `@ray.remote(max_restarts=R, max_task_retries=-1 unless R is 0)
     class Maker` (Ray Data's actor-pool defaults), keeps the ObjectRef
     of one `Maker.make.remote()` call, drops the actor handle, waits until the GCS lists the
     actor as DEAD, prints the actor table's death cause and restart budget, then sleeps (a job
     driver that is still running);
  3. SIGKILLs the head's process group and the driver (a head-node crash), starts the head again
     with the same command line on the same Redis, and checks whether `gcs_server` stays up and
     the cluster runs a task.

  python -m benchmarks.gcs_restartable_actor_repro                      # R = -1 (Ray Data's default) and R = 0
  python -m benchmarks.gcs_restartable_actor_repro --max-restarts -1 2 0

Prints a table and writes benchmarks/out/gcs_restartable_actor_repro.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

OUT = Path(__file__).parent / "out"
RAY = str(Path(sys.executable).with_name("ray"))

DRIVER = """
import json, sys, time
import ray

ray.init(address="{address}", log_to_driver=False)

# As Ray Data's actor pools: task retries with restarts, which makes Ray keep the lineage of the
# actor's outputs (and so the actor, while they are referenced).
@ray.remote(num_cpus=0, max_restarts={max_restarts}, max_task_retries=-1 if {max_restarts} != 0 else 0)
class Maker:
    def make(self):
        return b"x" * (1 << 20)  # 1 MiB: a plasma object whose lineage is this actor task

maker = Maker.remote()
actor_id = maker._actor_id.hex()
ref = maker.make.remote()
ray.get(ref)
del maker  # the handle goes out of scope; `ref` stays referenced

from ray._private.state import state
from ray.core.generated import common_pb2, gcs_pb2

def table_row():
    raw = state._connect_and_get_accessor().get_actor_info(ray.ActorID(bytes.fromhex(actor_id)))
    return gcs_pb2.ActorTableData.FromString(raw)

deadline = time.time() + 60
while time.time() < deadline and table_row().state != gcs_pb2.ActorTableData.DEAD:
    time.sleep(0.5)
row = table_row()
reason = row.death_cause.actor_died_error_context.reason
print(json.dumps({{"actor_id": actor_id, "state": gcs_pb2.ActorTableData.ActorState.Name(row.state),
                  "death_cause": common_pb2.ActorDiedErrorContext.Reason.Name(reason),
                  "table_max_restarts": row.max_restarts, "num_restarts": row.num_restarts}}), flush=True)
time.sleep(3600)  # a job driver still running when the head dies
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_group(cmd: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    with log.open("ab") as fh:
        return subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def head_processes(temp: Path) -> list[int]:
    """Pids of every process started under this head's temp dir (its raylet, GCS, workers...)."""
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    return [int(line.split()[0]) for line in out.splitlines() if str(temp) in line]


def run_case(max_restarts: int) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="gcsrepro", dir="/tmp"))
    temp, redis_port, gcs_port = work / "ray", free_port(), free_port()
    env = {
        **os.environ,
        "RAY_REDIS_ADDRESS": f"127.0.0.1:{redis_port}",
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "token"),
    }
    redis = start_group(
        [
            "redis-server",
            "--bind",
            "127.0.0.1",
            "--port",
            str(redis_port),
            "--dir",
            str(work),
            "--save",
            "",
            "--appendonly",
            "yes",
        ],
        work / "redis.log",
        env,
    )
    head_cmd = [
        RAY,
        "start",
        "--head",
        "--block",
        "--node-ip-address",
        "127.0.0.1",
        "--port",
        str(gcs_port),
        "--num-cpus",
        "1",
        "--temp-dir",
        str(temp),
        "--include-dashboard",
        "true",
        "--dashboard-host",
        "127.0.0.1",
        "--dashboard-port",
        str(free_port()),
        "--disable-usage-stats",
        "--ray-client-server-port",
        str(free_port()),
        "--dashboard-agent-listen-port",
        str(free_port()),
    ]
    procs: list[subprocess.Popen] = []
    row: dict[str, Any] = {"max_restarts": max_restarts}
    try:
        procs.append(start_group(head_cmd, work / "head1.log", env))
        address = f"127.0.0.1:{gcs_port}"
        wait_task(address, env, 120)
        driver = subprocess.Popen(
            [sys.executable, "-c", DRIVER.format(address=address, max_restarts=max_restarts)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=(work / "driver.err").open("w"),
            text=True,
            start_new_session=True,
        )
        procs.append(driver)
        line = driver.stdout.readline()
        if not line:
            raise RuntimeError(f"the driver printed nothing: {(work / 'driver.err').read_text()[-2000:]}")
        row.update(json.loads(line))
        # The crash: every process of the head and the driver at once.
        for proc in procs:
            kill_group(proc)
        for pid in head_processes(temp):  # workers that left the group (setsid) but belong to this head
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(2)
        procs.append(start_group(head_cmd, work / "head2.log", env))
        row["cluster_back"] = wait_task(address, env, 90)
        logs = sorted(temp.glob("session_*/logs/gcs_server*.out"), key=lambda p: p.stat().st_mtime)
        text = logs[-1].read_text(errors="replace") if logs else ""
        check = re.search(r"Check failed: (.*)", text)
        row["gcs_abort"] = check.group(1)[:120] if check else None
        loaded = re.findall(r"[Aa]ctor ([0-9a-f]{32})", text[: check.start()] if check else text)
        row["last_actor_before_abort"] = loaded[-1] if check and loaded else None
    finally:
        for proc in procs:
            kill_group(proc)
        for pid in head_processes(temp):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        kill_group(redis)
        shutil.rmtree(work, ignore_errors=True)
    return row


def wait_task(address: str, env: dict[str, str], timeout: float) -> bool:
    """Whether a driver can connect and run a task within ``timeout`` seconds."""
    code = (
        f"import ray; ray.init(address='{address}', log_to_driver=False); "
        "print(ray.get(ray.remote(lambda: 7).remote()))"
    )
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=40)
            if proc.stdout.strip().endswith("7"):
                return True
        except subprocess.TimeoutExpired:
            pass
        time.sleep(1)
    return False


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-restarts", type=int, nargs="+", default=[-1, 0])
    args = parser.parse_args(argv)
    if shutil.which("redis-server") is None:
        sys.exit("redis-server is not installed (Debian: apt-get install redis-server)")
    rows = [run_case(r) for r in args.max_restarts]
    cols = ["max_restarts", "state", "death_cause", "num_restarts", "cluster_back", "gcs_abort"]
    widths = [max(len(c), *(len(str(r.get(c))) for r in rows)) for c in cols]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    for r in rows:
        print("  ".join(str(r.get(c)).ljust(w) for c, w in zip(cols, widths)))
    import ray

    OUT.mkdir(exist_ok=True)
    (OUT / "gcs_restartable_actor_repro.json").write_text(json.dumps({"ray": ray.__version__, "cases": rows}, indent=1))
    return rows


if __name__ == "__main__":
    main()
