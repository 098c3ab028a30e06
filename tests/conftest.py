"""Shared fixtures: one real Ray cluster per session (own temp dir, loopback, stopped with
ray.shutdown()), a tiny model built once, and helpers to run pipelines as subprocesses."""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
GSM8K = SHARED / "data" / "gsm8k"
# Ray Train starts a preemption-watcher actor (one more process) per run, dozens of runs here;
# the suite has no preemptible nodes to watch. (Not OMP_WAIT_POLICY=PASSIVE: it makes the tiny
# learners' steps 1.8x slower and the suite took 76 minutes with it; only vLLM replicas set it,
# benchmarks/omp_wait_policy.py.)
os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
# Credentials for the S3 endpoint that tests/integration/test_storage.py starts on 127.0.0.1 (moto accepts any):
# set before the session's Ray cluster starts, so its learner workers, which write checkpoints
# there, have them, as a real cluster's nodes have theirs.
for _key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
    os.environ.setdefault(_key, "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")

# Small shapes so learner tests take seconds per step on 2 cores.
TINY = {
    "hidden_size": 64,
    "num_layers": 2,
    "num_heads": 2,
    "num_kv_heads": 1,
    "intermediate_size": 128,
    "vocab_size": 512,
}


SERVE_PORT = pytest.StashKey[int]()


@pytest.fixture(scope="session")
def ray_cluster(request: pytest.FixtureRequest):
    """A local Ray cluster for this test session; returns its GCS address.

    Serve starts with it, its HTTP proxy on 127.0.0.1 at a free port (``serve_url``). Serve is
    cluster-wide and keeps the first http_options it gets: a pipeline run against this cluster
    (which starts Serve on the default 8000 when none runs) would otherwise decide the port for
    every later test on this worker, and the two xdist workers' clusters would both ask for 8000."""
    import ray
    from ray import serve

    from raypost.utils.cluster import configure_ray_data

    temp = tempfile.mkdtemp(prefix="rpt", dir="/tmp")
    ray.init(num_cpus=4, include_dashboard=False, _temp_dir=temp, _node_ip_address="127.0.0.1", log_to_driver=False)
    configure_ray_data()
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    if not _listening(port):
        raise RuntimeError(f"Serve's proxy did not open 127.0.0.1:{port} within 30 s")
    request.config.stash[SERVE_PORT] = port
    yield ray.get_runtime_context().gcs_address
    serve.shutdown()  # replicas stop gracefully first: a vLLM engine frees its /dev/shm segments
    ray.shutdown()
    shutil.rmtree(temp, ignore_errors=True)


def _mapped_shm() -> set[str]:
    """The /dev/shm/psm_* segments some live process has mapped."""
    found: set[str] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            found.update(re.findall(r"/dev/shm/psm_[0-9a-f]+", maps.read_text()))
        except OSError:  # the process ended while we looked
            continue
    return found


@pytest.fixture(scope="session", autouse=True)
def no_leaked_shm():
    """A vLLM engine that is killed (the replica-kill tests, a head's shutdown) leaves its message
    queue's 160 MB /dev/shm/psm_* segment behind, in memory until reboot. Remove the segments this
    session created that no live process maps."""
    before = set(glob.glob("/dev/shm/psm_*"))
    yield
    for leaked in set(glob.glob("/dev/shm/psm_*")) - before - _mapped_shm():
        Path(leaked).unlink(missing_ok=True)


DURATIONS = Path(__file__).with_name("durations.json")  # seconds per test (>= 1 s) of a full run


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--record-durations",
        action="store_true",
        help=f"write each test's seconds (setup + call + teardown) to {DURATIONS.name}, which "
        "orders the work of `make test`'s workers",
    )


def _group(item: pytest.Item) -> str:
    mark = item.get_closest_marker("xdist_group")
    return mark.args[0] if mark and mark.args else item.module.__name__


def pytest_itemcollected(item: pytest.Item) -> None:
    """Scheduling for ``make test`` (pytest-xdist, ``--dist loadgroup``): a test runs with the rest
    of its module (module-scoped fixtures such as a started head or a distillation run are built
    once) unless it names its own ``xdist_group``. Marked here, as each test is collected: xdist
    reads the marks in its own ``pytest_collection_modifyitems``, which may run before ours."""
    if item.get_closest_marker("xdist_group") is None:
        item.add_marker(pytest.mark.xdist_group(_group(item)))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The groups go out longest first, by the seconds recorded in durations.json, so that the
    two workers finish close together. Stale or missing figures only change the order."""
    known = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}
    cost: Counter[str] = Counter()
    for item in items:
        cost[_group(item)] += known.get(item.nodeid.split("@")[0], 0.0)  # xdist may have added "@<group>"
    items.sort(key=lambda item: -cost[_group(item)])  # stable: collection order within a group


_seconds: Counter[str] = Counter()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _seconds[report.nodeid.split("@")[0]] += report.duration  # xdist appends "@<group>" to ids


def pytest_sessionfinish(session: pytest.Session) -> None:
    if session.config.getoption("--record-durations") and not hasattr(session.config, "workerinput"):
        DURATIONS.write_text(
            json.dumps({k: round(v, 1) for k, v in sorted(_seconds.items()) if v >= 1.0}, indent=1) + "\n"
        )


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def serve_url(ray_cluster: str, request: pytest.FixtureRequest) -> str:
    """The session cluster's Serve HTTP proxy (started with the cluster, see ``ray_cluster``)."""
    return f"http://127.0.0.1:{request.config.stash[SERVE_PORT]}"


def _listening(port: int, timeout: float = 30.0) -> bool:
    import socket
    import time

    deadline = time.time() + timeout
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.5)
    return False


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A tiny Qwen2 model + tokenizer trained on the synthetic task text."""
    from raypost.config import TinyModelConfig
    from raypost.data import synthetic
    from raypost.models.tiny import build_tiny_model

    rows = synthetic.generate(500, seed=7)
    texts = [r["question"] for r in rows] + [r["answer"] for r in rows]
    return build_tiny_model(TinyModelConfig(**TINY), texts, tmp_path_factory.mktemp("tiny") / "model")


def run_pipeline(
    script: str, args: list[str], address: str, timeout: float = 1500, check: bool = True
) -> subprocess.CompletedProcess:
    """Run ``pipelines/<script>`` as its own driver connected to the test cluster."""
    env = {**os.environ, "RAY_ADDRESS": address, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "token")}
    # the repository root importable, as a user's own modules are (environments named "tests.agent_envs:...")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "pipelines" / script), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{script} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return proc


@pytest.fixture(scope="session")
def untrained_reward_model(tmp_path_factory) -> Path:
    """MiniLM-L6 with a new score head (seeded), saved as the reward-model pipeline saves its
    model: a real reward model for the reward service to load and run, whose scores carry no
    meaning. Tests of the plumbing use it; the trained model's quality has its own test."""
    import torch

    from raypost.models.hf import load_sequence_classifier, load_tokenizer
    from raypost.phases.reward_model import default_backbone

    out = tmp_path_factory.mktemp("rm-untrained") / "hf"
    torch.manual_seed(0)
    load_sequence_classifier(default_backbone()).save_pretrained(out)
    load_tokenizer(default_backbone()).save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def trained_reward_model(ray_cluster, tmp_path_factory) -> Path:
    """The run folder of MiniLM-L6 trained for 8 steps (lr 1e-4) on pairs built from the first
    1,500 GSM8K train rows, held out: pairs from the first 300 GSM8K test rows, by
    ``pipelines/reward_model.py`` on the test cluster. 8 steps see 128 pairs (held-out pairwise
    accuracy 0.84 in one run, 0.86 after 20 steps at 5e-5; chance is 0.5); the subsets only save
    preprocessing time."""
    out = tmp_path_factory.mktemp("rm")
    subsets = {}
    for split, rows in (("train", 1500), ("test", 300)):
        subsets[split] = out / f"gsm8k_{split}_head.jsonl"
        with open(GSM8K / f"{split}.jsonl") as f:
            subsets[split].write_text("".join(line for _, line in zip(range(rows), f)))
    run_pipeline(
        "reward_model.py",
        [
            "--dataset",
            str(subsets["train"]),
            "--data.eval_path",
            str(subsets["test"]),
            "--run.storage_path",
            str(out),
            "--run.name",
            "rm",
            "--run.wandb_mode",
            "disabled",
            "--train.max_steps",
            "8",
            "--optim.lr",
            "1e-4",
            "--train.max_eval_pairs",
            "96",
        ],
        ray_cluster,
        timeout=1500,
    )
    return out / "rm"
