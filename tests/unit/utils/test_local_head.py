"""A local head's ports: picked together, so no two of its components get the same one (a head
whose GCS and dashboard drew the same free port failed to start: `ray start` refuses)."""

from __future__ import annotations

from raypost.utils.local_head import LocalHead, free_ports


def test_ports_picked_together_are_distinct():
    for _ in range(20):
        ports = free_ports(16)
        assert len(set(ports)) == 16


def test_a_heads_four_ports_are_distinct_and_kept_for_its_restarts(tmp_path):
    for _ in range(20):
        head = LocalHead(temp_dir=str(tmp_path))
        cmd = head.command()
        ports = [head.gcs_port, head.dashboard_port, *head.side_ports]
        assert len(set(ports)) == 4 and all(ports)
        assert cmd == head.command()  # a restart of the same head uses the same ports
        assert cmd[cmd.index("--port") + 1] == str(head.gcs_port)
        assert cmd[cmd.index("--dashboard-port") + 1] == str(head.dashboard_port)
    given = LocalHead(temp_dir=str(tmp_path), gcs_port=6390)
    assert given.gcs_port == 6390 and given.dashboard_port != 6390
