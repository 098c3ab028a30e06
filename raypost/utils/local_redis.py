"""Debian's ``redis-server`` on 127.0.0.1 at a free port, in its own folder: the GCS store of a
fault-tolerant local head (``raypost.utils.local_head.LocalHead(redis_address=...)``), for the
recovery drills and tests."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

from raypost.utils.local_head import free_port


@dataclass
class LocalRedis:
    """Debian's ``redis-server`` on 127.0.0.1 at a free port, with its data in its own folder:
    the GCS store of a fault-tolerant head (``LocalHead(redis_address=redis.address)``)."""

    port: int = field(default_factory=free_port)
    data_dir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="rpr", dir="/tmp"))
    proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> LocalRedis:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed; `make redis` installs Debian's redis-server")
        self.proc = subprocess.Popen(
            [
                binary,
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--dir",
                self.data_dir,
                "--save",
                "",
                "--appendonly",
                "yes",
                "--protected-mode",
                "yes",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as conn:
                    conn.sendall(b"PING\r\n")
                    if conn.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"redis-server did not answer on {self.address} in {timeout:.0f} s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> LocalRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
