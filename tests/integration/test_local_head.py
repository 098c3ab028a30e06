"""A local head whose port is taken between picking it and ``ray start`` binding it (another
cluster starting on this machine at the same moment: a CI run lost two GRPO tests to it, the
dashboard's port) picks its ports again and comes up; a port the caller chose is kept."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from raypost.utils import local_head
from raypost.utils.local_head import LocalHead


@pytest.mark.timeout(300)
def test_a_head_whose_dashboard_port_is_taken_picks_its_ports_again(monkeypatch):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    real, calls = local_head.free_ports, []

    def first_draw_taken(n: int) -> list[int]:
        ports = real(n)
        calls.append(n)
        return [ports[0], port, *ports[2:]] if len(calls) == 1 else ports

    monkeypatch.setattr(local_head, "free_ports", first_draw_taken)
    try:
        with LocalHead(num_cpus=1) as head:  # a short temp dir of its own (Ray's socket paths)
            assert head.dashboard_port != port and head._dashboard_up()
            first = (Path(head.temp_dir) / "ray_start.1.log").read_text()
            assert "already occupied" in first and f"127.0.0.1:{port}" in first
        assert not Path(head.temp_dir).exists()  # stopped and removed, as always
        # The caller's own port is kept: the other ports are picked again, the attempts run out.
        given = LocalHead(num_cpus=1, dashboard_port=port)
        with pytest.raises(RuntimeError, match=r"ray start exited .*ray_start\.3\.log"), given:
            pass
        assert given.dashboard_port == port
        assert not Path(given.temp_dir).exists()  # a head that failed to start is cleaned up too
    finally:
        taken.close()
