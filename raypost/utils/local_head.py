"""A local Ray head started with ``ray start --head --block``: its own temp dir, free ports on
127.0.0.1, optional Redis for GCS fault tolerance (``local_redis``), and stopped by its own process group (never
``ray stop``, which kills every Ray cluster on the machine). Used by tests, the chaos drills and
``python -m raypost.utils.local_head [--num-cpus N] [--redis HOST:PORT]`` for users."""

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
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psutil

# What `ray start` prints when a port it was given is taken (Ray 2.x's dashboard, GCS and others).
PORT_TAKEN = re.compile(r"already occupied|already in use|Failed to bind", re.IGNORECASE)


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 now, bound together while picked (one at a time, a
    head once got one port for its GCS and its dashboard, and ``ray start`` refused)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        return [s.bind(("127.0.0.1", 0)) or s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now."""
    return free_ports(1)[0]


@dataclass
class LocalHead:
    """One head node. ``start()`` returns when the dashboard (job server) answers."""

    num_cpus: int = 4
    temp_dir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="rph", dir="/tmp"))
    redis_address: str | None = None
    # True: `ray start --block`, which tears the whole head down when any of its processes dies
    # (tests want that). False: the processes outlive `ray start`, so the GCS alone can be killed
    # and restarted (recovery drills); stop() reaches them through their process group either way.
    block: bool = True
    # False: leaving the ``with`` block removes temp_dir (logs, session files) after stopping.
    keep_temp: bool = False
    gcs_port: int = 0  # 0: a free port, distinct from the head's other three
    dashboard_port: int = 0
    proc: subprocess.Popen | None = None
    extra_procs: list[subprocess.Popen] = field(default_factory=list)
    nodes: list[subprocess.Popen] = field(default_factory=list)
    side_ports: tuple[int, int] = (0, 0)  # client server, dashboard agent (defaults 10001, 52365 clash)

    # The ports left to this head to pick (given as 0): picked again when `ray start` finds one taken.
    _picked: tuple[bool, bool, bool] = (False, False, False)

    def __post_init__(self) -> None:
        self._picked = (not self.gcs_port, not self.dashboard_port, not any(self.side_ports))
        self._pick_ports()

    def _pick_ports(self) -> None:
        gcs, dashboard, client, agent = free_ports(4)
        picked_gcs, picked_dashboard, picked_side = self._picked
        self.gcs_port = gcs if picked_gcs else self.gcs_port
        self.dashboard_port = dashboard if picked_dashboard else self.dashboard_port
        self.side_ports = (client, agent) if picked_side else self.side_ports

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def env(self) -> dict[str, str]:
        """Environment for clients of this head (drivers, ``ray job submit``)."""
        return {
            **os.environ,
            "RAY_ADDRESS": self.address,
            "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "token"),
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        }

    def command(self) -> list[str]:
        ray_bin = str(Path(sys.executable).with_name("ray"))
        return [
            ray_bin,
            "start",
            "--head",
            *(["--block"] if self.block else []),
            "--node-ip-address",
            "127.0.0.1",
            "--port",
            str(self.gcs_port),
            "--num-cpus",
            str(self.num_cpus),
            "--temp-dir",
            self.temp_dir,
            "--include-dashboard",
            "true",
            "--dashboard-host",
            "127.0.0.1",
            "--dashboard-port",
            str(self.dashboard_port),
            "--disable-usage-stats",
            "--ray-client-server-port",
            str(self.side_ports[0]),
            "--dashboard-agent-listen-port",
            str(self.side_ports[1]),
        ]

    def start(self, timeout: float = 300.0, attempts: int = 3) -> LocalHead:
        """``ray start``, within ``timeout`` seconds. A port of this head's own picking that another
        process took before ``ray start`` bound it (another cluster starting on this machine at the
        same moment: seen in CI, the dashboard's port) is picked again, up to ``attempts`` times."""
        for attempt in range(1, attempts + 1):
            Path(self.temp_dir).mkdir(parents=True, exist_ok=True)
            log = Path(self.temp_dir) / f"ray_start.{attempt}.log"
            try:
                return self._start_once(timeout, log)
            except RuntimeError:
                taken = PORT_TAKEN.search(log.read_text(errors="replace")) is not None
                if not (taken and any(self._picked)) or attempt == attempts:
                    raise
                self._pick_ports()
        raise AssertionError("unreachable")

    def _start_once(self, timeout: float, log: Path) -> LocalHead:
        env = self.env()
        env.pop("RAY_ADDRESS")
        if self.redis_address:
            env["RAY_REDIS_ADDRESS"] = self.redis_address
        with log.open("ab") as fh:  # the child keeps its own copy of the descriptor
            # Own session: stop() signals exactly this process group.
            self.proc = subprocess.Popen(
                self.command(), env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() not in (None, *([] if self.block else [0])):
                self.stop()
                raise RuntimeError(f"ray start exited with {self.proc.returncode}; see {log}")
            if self._dashboard_up():
                return self
            time.sleep(1.0)
        self.stop()
        raise TimeoutError(f"Ray head did not come up in {timeout:.0f} s; see {log}")

    def add_node(self, num_cpus: int, resources: dict[str, float] | None = None, timeout: float = 300.0) -> str:
        """Start another raylet on this machine that joins this head (``raypost.utils.local_node``)
        with ``resources`` as its custom resources: a second node, with its own node id, for
        placement tests. Returns its node id; ``stop()`` stops it before the head."""
        ready = Path(self.temp_dir) / f"node_{len(self.nodes)}.id"
        cmd = [
            sys.executable,
            "-m",
            "raypost.utils.local_node",
            "--address",
            self.address,
            "--num-cpus",
            str(num_cpus),
            "--resources",
            json.dumps(resources or {}),
            "--ready-file",
            str(ready),
            "--temp-dir",
            tempfile.mkdtemp(prefix=f"node{len(self.nodes)}-", dir=self.temp_dir),
        ]
        env = self.env()
        env.pop("RAY_ADDRESS")
        log = ready.with_suffix(".log")
        with log.open("ab") as fh:
            self.nodes.append(
                subprocess.Popen(
                    cmd,
                    env=env,
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    cwd=Path(__file__).resolve().parents[2],
                    start_new_session=True,
                )
            )
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.nodes[-1].poll() is not None:
                raise RuntimeError(f"the node exited with {self.nodes[-1].returncode}; see {log}")
            if ready.is_file() and ready.read_text():
                return ready.read_text()
            time.sleep(0.5)
        raise TimeoutError(f"the node did not start in {timeout:.0f} s; see {log}")

    def _dashboard_up(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.dashboard_url}/api/version", timeout=2) as resp:
                return "ray_version" in json.loads(resp.read())
        except urllib.error.HTTPError:
            return True  # token auth on: the server is up and asks for the token
        except (OSError, ValueError):
            return False

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the head's process group (ray start --block stops its children), then SIGKILL
        after ``timeout`` seconds; a GCS started by ``restart_gcs`` is stopped the same way. The
        grace is short: a GCS under load was seen to hang in its SIGTERM shutdown for over 30 s,
        and what outlives a head (Redis tables, checkpoints) does not depend on a graceful exit."""
        for extra in (*self.nodes, *self.extra_procs):
            _stop_group(extra, timeout)
        self.nodes.clear()
        self.extra_procs.clear()
        if self.proc is not None:
            _stop_group(self.proc, timeout)

    def crash(self) -> None:
        """SIGKILL every process of the head at once (a node failure, not a shutdown)."""
        for proc in (*self.nodes, *self.extra_procs, self.proc):
            if proc is not None:
                _stop_group(proc, timeout=0.0, signals=(signal.SIGKILL,))
        self.nodes.clear()
        self.extra_procs.clear()

    def gcs_process(self) -> psutil.Process:
        """This head's ``gcs_server``: the one in its process group, or one restart_gcs started."""
        import psutil

        groups = {p.pid for p in (self.proc, *self.extra_procs) if p is not None}
        for proc in psutil.process_iter(["name"]):
            try:
                if (
                    proc.info["name"] == "gcs_server"
                    and os.getpgid(proc.pid) in groups
                    and proc.status() != psutil.STATUS_ZOMBIE
                ):
                    return proc
            except (psutil.NoSuchProcess, ProcessLookupError):
                continue
        raise RuntimeError(f"no gcs_server runs under this head (temp dir {self.temp_dir})")

    def kill_gcs(self) -> tuple[list[str], dict[str, str], str]:
        """SIGKILL only the GCS (needs ``block=False``: ``ray start --block`` would tear the whole
        head down). Returns what ``restart_gcs`` needs. SIGTERM is no substitute: a GCS under
        load was seen to hang in its graceful shutdown for over a minute."""
        if self.block:
            raise RuntimeError("kill_gcs needs LocalHead(block=False)")
        proc = self.gcs_process()
        spec = (proc.cmdline(), proc.environ(), proc.cwd())
        proc.kill()
        _wait_exited(proc, 30.0)
        return spec

    def restart_gcs(self, spec: tuple[list[str], dict[str, str], str]) -> None:
        """Start the GCS again with the same command line; with Redis it reloads its tables and
        the raylet reconnects (within ``RAY_gcs_rpc_server_reconnect_timeout_s``, 60 s)."""
        cmd, env, cwd = spec
        log = Path(self.temp_dir) / "gcs_restart.log"
        with log.open("ab") as fh:
            self.extra_procs.append(
                subprocess.Popen(cmd, env=env, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
            )

    def __enter__(self) -> LocalHead:
        try:
            return self.start()
        except BaseException:
            self.__exit__()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
        if not self.keep_temp:
            shutil.rmtree(self.temp_dir, ignore_errors=True)


def _stop_group(
    proc: subprocess.Popen, timeout: float, signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGKILL)
) -> None:
    """Signal a process group started with start_new_session: SIGTERM, then SIGKILL after ``timeout``."""
    if proc.poll() is not None and not _group_alive(proc.pid):
        return
    for sig in signals:
        wait = timeout if sig == signal.SIGTERM else 10.0
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.time() + wait
        while time.time() < deadline and _group_alive(proc.pid):
            proc.poll()
            time.sleep(0.5)
        if not _group_alive(proc.pid):
            return


def _wait_exited(proc: psutil.Process, timeout: float) -> None:
    """Wait until ``proc`` is gone or a zombie (exited; its parent may never reap it)."""
    import psutil

    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.1)
    raise TimeoutError(f"process {proc.pid} still runs {timeout:.0f} s after it was killed")


def _group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (zombies, exited but never reaped, don't count)."""
    import psutil

    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                return True
        except (psutil.NoSuchProcess, ProcessLookupError):
            continue
    return False


def main(argv: list[str] | None = None) -> None:
    """Start a head, print how to reach it, and stop it on Ctrl-C or SIGTERM."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--num-cpus", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--redis", default=None, help="HOST:PORT of Redis for GCS fault tolerance")
    args = parser.parse_args(argv)
    head = LocalHead(num_cpus=args.num_cpus, redis_address=args.redis).start()
    print(f"RAY_ADDRESS={head.address}  dashboard/jobs: {head.dashboard_url}  temp dir: {head.temp_dir}", flush=True)
    print(
        f"ray job submit --address {head.dashboard_url} --working-dir . -- {sys.executable} pipelines/grpo.py",
        flush=True,
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while head.proc is not None and head.proc.poll() is None:
            time.sleep(1.0)
    except KeyboardInterrupt:
        pass
    finally:
        head.stop()


if __name__ == "__main__":
    main()
