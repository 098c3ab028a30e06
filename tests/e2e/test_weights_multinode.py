"""Weights to replicas on other nodes (issue 21), through Ray's object store and over a gloo
group (collective), on a cluster this test starts (own temp dir and ports, stopped by its
process group): a head, where the driver pushes weights as the learner's rank 0 would, node B
for the rollout replicas, and node C, added while the app runs. The driver
(``tests/weights_multinode_driver.py``) reports each step.

Both transports survive a replica killed during a push, whose replacement pulls the latest
version before its first request. ``collective`` also scales out to node C; ``object_store``'s
late replica on a new node is the same fetch, and its scale-out cost this suite 2-3 minutes
(three more vLLM engine start-ups)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from raypost.utils.local_head import LocalHead
from tests.conftest import ROOT


def drive(head: LocalHead, model: Path, key: str, log: Path, transport: str, scale: bool) -> dict[str, dict]:
    """Run the driver; when it asks for node C, add it. Returns its steps by name."""
    steps: dict[str, dict] = {}
    with log.open("w") as err:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.weights_multinode_driver",
                str(model),
                key,
                transport,
                *(["scale"] if scale else []),
            ],
            cwd=ROOT,
            env=head.env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
        try:
            for line in proc.stdout:
                if not line.startswith("{"):
                    continue
                step = json.loads(line)
                steps[step["step"]] = step
                if step["step"] == "add_node_c":
                    steps["node_c"] = {"id": head.add_node(2, {"rollout_node": 1})}
                    proc.stdin.write("go\n")
                    proc.stdin.flush()
            assert proc.wait(timeout=120) == 0, log.read_text()[-5000:]
        finally:
            if proc.poll() is None:
                proc.kill()
            (log.parent / "steps.json").write_text(json.dumps(steps, indent=1))  # with each step's time
    return steps


# On the GRPO job test's worker, after it: beside it, both starting vLLM replicas on 2 cores, these
# took 255-348 s each against 104-145 s alone (benchmarks/RESULTS.md, "Test suite time").
@pytest.mark.xdist_group("tests.e2e.test_grpo")
@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize(("transport", "scale"), [("object_store", False), ("collective", True)])
def test_replicas_killed_during_a_push_or_added_on_a_new_node_serve_the_latest_version(
    tiny_model, tmp_path, transport, scale
):
    key = f"test-{tmp_path.name}"
    with LocalHead(num_cpus=2) as head:
        node_b = head.add_node(2, {"rollout_node": 2})
        steps = drive(head, tiny_model, key, tmp_path / "driver.log", transport, scale)
    # Both replicas run on node B, and serve version 1, pushed from the head.
    first = steps["deployed"]
    assert first["replica_nodes"] == [node_b] and set(first["versions"]) == {1}
    # A replica killed while the replicas load version 2: no request hangs or fails (they are
    # retried on the other replica), every answer is version 2, and so is every answer once the
    # replacement (on node B again) serves.
    killed = steps["killed_during_push"]
    assert not killed["hung"] and killed["errors"] == []
    assert len(killed["versions"]) == 16 and set(killed["versions"]) == {2}
    assert set(killed["later"]) == {2} and killed["replica_nodes"] == [node_b]
    assert ("scaled" in steps) == scale
    if scale:
        assert_scaled_to_node_c(steps, node_b)
    # The run's end removes the version record and every staged copy.
    assert steps["done"]["board_left"] is False


def assert_scaled_to_node_c(steps: dict[str, dict], node_b: str) -> None:
    node_c = steps["node_c"]["id"]
    # A replica added on node C after the push pulls version 2 before its first request. Node B's
    # replicas were killed first, so these requests were answered on node C.
    scaled = steps["scaled"]
    assert scaled["replica_nodes"] == sorted([node_b, node_c]) and scaled["new_nodes"] == [node_c]
    assert len(scaled["versions"]) == 8 and set(scaled["versions"]) == {2}
    assert node_c in scaled["live_after"]
