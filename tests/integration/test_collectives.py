"""The learners' host collectives work under every process group a learner can get.

On GPU workers Ray Train sets up NCCL alone, and NCCL has no CPU backend: a CPU tensor in a
collective fails there ("No backend type associated with device type cpu"), which crashed
every learner at its first step on a GPU. ``backend="cuda:gloo"`` refuses CPU tensors the same
way on CPUs alone, so the failure is reproduced here with 2 real ranks. The second test keeps
the whole class out: no module calls a ``torch.distributed`` collective except through
``raypost.train.collectives``.
"""

from __future__ import annotations

import ast
import os
import socket
from pathlib import Path

import pytest
import torch.multiprocessing as mp

from tests.conftest import ROOT

BACKENDS = ["gloo", "cuda:gloo", "cpu:gloo,cuda:gloo"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, world: int, port: int, backend: str, out: str) -> None:
    import json

    import torch.distributed as dist

    from raypost.train import collectives
    from raypost.train.steps.rm import all_mean

    dist.init_process_group(backend=backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        sums = [collectives.all_sum(1.0, float(rank), 0.5) for _ in range(3)]  # the side group is made once
        batch = collectives.broadcast_from_rank0({"rows": [[1, 2, 3], [4]], "cursor": 7} if rank == 0 else None, rank)
        collectives.barrier()
        means = all_mean([float(rank + 1)], counts=float(rank + 1))  # (1*1 + 2*2) / 3
        result = {
            "sums": sums,
            "batch": batch,
            "means": means,
            "side_groups": len(collectives._side),
            "cpu_default": collectives.takes_cpu_tensors(),
        }
        Path(out, f"{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("backend", BACKENDS)
def test_host_collectives_work_under_every_backend(backend, tmp_path):
    import json

    os.environ.setdefault("PYTHONPATH", str(ROOT))
    mp.spawn(_rank, args=(2, _free_port(), backend, str(tmp_path)), nprocs=2, join=True)
    results = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(2)]
    for r in results:
        assert r["sums"] == [[2.0, 1.0, 1.0]] * 3
        assert r["batch"] == {"rows": [[1, 2, 3], [4]], "cursor": 7}
        assert r["means"] == pytest.approx([5 / 3])
        cpu = backend != "cuda:gloo"
        assert r["cpu_default"] is cpu
        assert r["side_groups"] == (0 if cpu else 1)  # a side group only where the default takes no CPU tensors


COLLECTIVES = {
    "all_reduce",
    "all_gather",
    "all_gather_object",
    "all_gather_into_tensor",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "gather_object",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
    "scatter_object_list",
    "send",
    "recv",
    "isend",
    "irecv",
    "monitored_barrier",
}
ALLOWED = {ROOT / "raypost" / "train" / "collectives.py"}


def _direct_collectives(path: Path, base: Path = ROOT) -> list[str]:
    """Calls ``dist.X(...)`` / ``torch.distributed.X(...)`` of a collective X in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in COLLECTIVES:
            owner = ast.unparse(node.func.value)
            if owner in ("dist", "torch.distributed"):
                found.append(f"{path.relative_to(base)}:{node.lineno}: {owner}.{node.func.attr}")
    return found


def test_no_collective_bypasses_the_host_helpers():
    files = [p for folder in ("raypost", "benchmarks", "pipelines") for p in (ROOT / folder).rglob("*.py")]
    assert len(files) > 50
    direct = [hit for p in files if p not in ALLOWED for hit in _direct_collectives(p)]
    assert direct == [], (
        f"collectives outside raypost/train/collectives.py (a CPU tensor there fails under NCCL alone): {direct}"
    )


def test_the_scan_sees_a_direct_collective(tmp_path):
    """The scan above can fail: it finds the call that crashed every learner on a GPU."""
    bad = tmp_path / "engine.py"
    bad.write_text(
        "import torch\nimport torch.distributed as dist\n\n"
        "def all_sum(x):\n    t = torch.tensor(x)\n    dist.all_reduce(t)\n    return t\n"
    )
    assert _direct_collectives(bad, tmp_path) == ["engine.py:6: dist.all_reduce"]
