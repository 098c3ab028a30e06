"""A local Ray head started with ``ray start --head --block``: its own temp dir, free ports on
127.0.0.1, optional Redis for GCS fault tolerance, and stopped by its own process group (never
``ray stop``, which kills every Ray cluster on the machine). Used by tests, the chaos drills and
``python -m raypost.utils.local_head [--num-cpus N] [--redis HOST:PORT]`` for users."""

from __future__ import annotations

import argparse
import json
import os
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


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LocalHead:
    """One head node. ``start()`` returns when the dashboard (job server) answers."""

    num_cpus: int = 4
    temp_dir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="rph", dir="/tmp"))
    redis_address: str | None = None
    gcs_port: int = field(default_factory=free_port)
    dashboard_port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def env(self) -> dict[str, str]:
        """Environment for clients of this head (drivers, ``ray job submit``)."""
        return {**os.environ, "RAY_ADDRESS": self.address, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "token"),
                "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}

    def command(self) -> list[str]:
        ray_bin = str(Path(sys.executable).with_name("ray"))
        return [ray_bin, "start", "--head", "--block", "--node-ip-address", "127.0.0.1",
                "--port", str(self.gcs_port), "--num-cpus", str(self.num_cpus), "--temp-dir", self.temp_dir,
                "--include-dashboard", "true", "--dashboard-host", "127.0.0.1",
                "--dashboard-port", str(self.dashboard_port), "--disable-usage-stats",
                # Ports that otherwise default to fixed numbers (10001, 52365) and clash between heads.
                "--ray-client-server-port", str(free_port()), "--dashboard-agent-listen-port", str(free_port())]

    def start(self, timeout: float = 120.0) -> "LocalHead":
        env = self.env()
        env.pop("RAY_ADDRESS")
        if self.redis_address:
            env["RAY_REDIS_ADDRESS"] = self.redis_address
        log = Path(self.temp_dir) / "ray_start.log"
        with log.open("ab") as fh:  # the child keeps its own copy of the descriptor
            # Own session: stop() signals exactly this process group.
            self.proc = subprocess.Popen(self.command(), env=env, stdout=fh, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ray start exited with {self.proc.returncode}; see {log}")
            if self._dashboard_up():
                return self
            time.sleep(1.0)
        self.stop()
        raise TimeoutError(f"Ray head did not come up in {timeout:.0f} s; see {log}")

    def _dashboard_up(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.dashboard_url}/api/version", timeout=2) as resp:
                return "ray_version" in json.loads(resp.read())
        except urllib.error.HTTPError:
            return True  # token auth on: the server is up and asks for the token
        except (OSError, ValueError):
            return False

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the head's process group (ray start --block stops its children), then SIGKILL."""
        if self.proc is None or self.proc.poll() is not None and not _group_alive(self.proc.pid):
            return
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            deadline = time.time() + wait
            while time.time() < deadline and _group_alive(self.proc.pid):
                self.proc.poll()
                time.sleep(0.5)
            if not _group_alive(self.proc.pid):
                return

    def __enter__(self) -> "LocalHead":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main(argv: list[str] | None = None) -> None:
    """Start a head, print how to reach it, and stop it on Ctrl-C or SIGTERM."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--num-cpus", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--redis", default=None, help="HOST:PORT of Redis for GCS fault tolerance")
    args = parser.parse_args(argv)
    head = LocalHead(num_cpus=args.num_cpus, redis_address=args.redis).start()
    print(f"RAY_ADDRESS={head.address}  dashboard/jobs: {head.dashboard_url}  temp dir: {head.temp_dir}", flush=True)
    print(f"ray job submit --address {head.dashboard_url} --working-dir . -- {sys.executable} pipelines/grpo.py",
          flush=True)
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
