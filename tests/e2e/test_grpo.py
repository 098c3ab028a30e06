"""GRPO end to end, submitted as a Ray job to a cluster this test starts (own temp dir and ports,
stopped by its process group): a head and two worker nodes on this machine, the learner pinned to
one and the vLLM replicas to the other through custom resources, so the weights cross nodes (Ray's
object store). SFT warm-up, vLLM rollouts on Serve, rewards from the reward service, DeepSpeed
learner, versioned weight pushes; GRPO learning, as a held-out accuracy gain over the SFT warm-up;
then a re-submission that resumes, asynchronous and with a reward model."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from raypost.utils.local_head import LocalHead
from tests.conftest import ROOT

LEARN_STEPS = 30
STEP_KEYS = (
    "reward_mean",
    "reward_std",
    "accuracy",
    "clip_frac",
    "entropy",
    "response_len",
    "generate_s",
    "reward_s",
    "train_s",
    "push_s",
    "staleness_p50",
    "staleness_p99",
    "learner_wait_frac",
    "producer_wait_frac",
    "dropped_stale",
    "groups_failed",
    "behav_ratio_mean",
)
# The learner's workers request one of these, the rollout replicas the other: two node groups.
PINNED = ["--resources.ray_resources.learner_node", "1", "--rollout.ray_resources.rollout_node", "1"]


@dataclass
class Nodes:
    head: LocalHead
    learner: str  # node ids
    rollout: str


@pytest.fixture(scope="module")
def cluster():
    """A head (2 CPUs), node A (2 CPUs, ``learner_node``) and node B (2 CPUs, ``rollout_node``)."""
    with LocalHead(num_cpus=2) as h:  # removes its temp dir on exit
        yield Nodes(h, h.add_node(2, {"learner_node": 4}), h.add_node(2, {"rollout_node": 4}))


RUN_SECRET = "run-secret-5f0c8e7a2b914d36"


def submit(head: LocalHead, args: list[str], timeout: float = 1500) -> str:
    """``ray job submit --working-dir <repo> -- <venv python> pipelines/grpo.py ARGS``; returns its output."""
    cmd = [
        str(Path(sys.executable).with_name("ray")),
        "job",
        "submit",
        "--address",
        head.dashboard_url,
        "--working-dir",
        str(ROOT),
        "--",
        sys.executable,
        "pipelines/grpo.py",
        *args,
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=head.env(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0 and "succeeded" in proc.stdout, f"{proc.stdout[-5000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def serve_apps(head: LocalHead) -> set[str]:
    """Names of the Serve apps on the head's cluster (``serve status``)."""
    cmd = [str(Path(sys.executable).with_name("serve")), "status", "-a", head.dashboard_url]
    proc = subprocess.run(cmd, env=head.env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return set((yaml.safe_load(proc.stdout) or {}).get("applications") or {})


def actor_nodes(head: LocalHead, class_name: str) -> set[str]:
    """Node ids of every actor of ``class_name`` this cluster ran (dead ones too)."""
    cmd = [
        str(Path(sys.executable).with_name("ray")),
        "list",
        "actors",
        "--format",
        "json",
        "--address",
        head.address,
        "--filter",
        f"class_name={class_name}",
        "--limit",
        "10000",
    ]
    proc = subprocess.run(cmd, env=head.env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {a["node_id"] for a in json.loads(proc.stdout)}


def grpo_rows(run: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("phase") == "grpo"]


@pytest.mark.slow
@pytest.mark.timeout(3600)  # two jobs
def test_grpo_job_learns_then_resumes_async_with_a_reward_model(cluster, tmp_path, untrained_reward_model):
    """GRPO learns, measured as the issue asks (held-out greedy accuracy goes up), in a job
    submitted with ``ray job submit``; the same job re-submitted with a longer budget resumes
    after the last step, asynchronous and with a reward model added.

    The embedded task as the default builds it (half the SFT demos are a weak teacher's wrong
    guess, '#### <first number>'), on easier operands (1..5) so a one-epoch warm-up learns the
    worked solutions too. The warmed-up greedy policy mostly guesses; GRPO's accuracy reward has
    to move it to the worked solutions it already knows. Broken advantages, a loss of the wrong
    sign, weights that never reach the replicas or a stale reference all leave the gain at ~0.
    (One run serves both checks: a second GRPO job of its own cost this suite 5-10 minutes.)"""
    args = [
        "--run.storage_path",
        str(tmp_path),
        "--run.name",
        "g",
        "--run.wandb_mode",
        "disabled",
        "--run.checkpoint_every",
        "1000",
        "--data.synthetic.max_operand",
        "5",
        "--data.synthetic.num_train",
        "6000",
        "--warmup.train.epochs",
        "1",
        "--optim.lr",
        "1e-4",
        "--algo.prompts_per_step",
        "16",
        "--rollout.weights.transport",
        "object_store",
        *PINNED,
    ]
    head = cluster.head
    submit(head, [*args, "--algo.steps", str(LEARN_STEPS)], timeout=2200)
    run = tmp_path / "g"
    first = json.loads((run / "report.json").read_text())
    before, after = first["heldout_accuracy_before"], first["heldout_accuracy_after"]
    assert first["heldout_n"] == 200 and (run / "reward.png").stat().st_size > 1000
    # Measured from this warm-up (0.08), 30 steps at lr 1e-4, run.seed 1-5 (2026-12-04): +0.15 to +0.19 with
    # 16 prompts a step (mean +0.176), +0.12 to +0.195 with 8 (mean +0.16); 16 cost 20-40 s more. One suite run
    # on CI with 8 gained -0.015, unexplained (its per-step trace was not kept; the message below has it now).
    # The default lr 5e-5 is too slow for 30 steps (-0.015 in one run). The bound is 2 standard errors of a
    # paired difference of 200 greedy answers (sqrt(30)/200 = 0.027 when 30 of the 200 answers change): a GRPO
    # that does not learn (zero advantages, a flipped sign, weights that never reach the replicas) gains 0 or loses.
    # (step, reward, pi_learner/pi_behaviour) of each step, for a failure to show how the run went.
    trace = [(r["step"], round(r["reward_mean"], 3), round(r["behav_ratio_mean"], 4)) for r in grpo_rows(run)]
    assert all(abs(ratio - 1.0) < 0.02 for _, _, ratio in trace), trace  # the replicas served the learner's weights
    assert after >= before + 0.05, (before, after, trace)
    # The finished job took its rollout and reward apps with it.
    assert serve_apps(head) == set()
    # Every learner worker (warm-up and GRPO) ran on node A, every rollout replica on node B: the
    # pushed weights crossed nodes, and behav_ratio_mean (below) shows they arrived whole.
    assert actor_nodes(head, "RayTrainWorker") == {cluster.learner}
    assert actor_nodes(head, "ServeReplica:g-rollout:RolloutServer") == {cluster.rollout}

    # Re-submitting with a longer budget resumes after the last step: the warm-up is not redone,
    # 3 more steps are trained from new prompts and weight versions continue. The resumed run is
    # async (eta 1), adds a reward model (MiniLM, untrained head) to the verifier rewards, and
    # pushes its weights to node B over a gloo group (collective), with no file.
    total = LEARN_STEPS + 3
    out = submit(
        head,
        [
            *args,
            "--algo.steps",
            str(total),
            "--async_rl.eta",
            "1",
            "--rollout.weights.transport",
            "collective",
            "--reward.model.path",
            str(untrained_reward_model),
            "--reward.model.weight",
            "0.5",
            "--reward.auth_token",  # on the command line, the worst place for it
            RUN_SECRET,
            "--run.wandb_mode",
            "offline",
        ],
    )
    assert "sft step" not in out
    assert serve_apps(head) == set()
    grpo = grpo_rows(run)
    steps = list(range(1, total + 1))
    assert [r["step"] for r in grpo] == steps and [r["weight_version"] for r in grpo] == steps
    beta = first["config"]["algo"]["beta"]
    for r in grpo:
        for key in STEP_KEYS:
            assert key in r, key
        assert ("kl" in r) == (beta > 0), "the KL to the reference is logged exactly when it is in the loss"
        assert r["dropped_stale"] == 0 and r["groups_failed"] == 0
    for r in grpo[:LEARN_STEPS]:
        assert r["staleness_max"] == 0  # synchronous: every sample from the current version
        # The learner's log-probs equal the replicas' behaviour log-probs of the same version, so
        # pi_learner / pi_behaviour stays at 1 (a stale or half-reloaded replica moves it).
        assert abs(r["behav_ratio_mean"] - 1.0) < 0.02, (r["step"], r["behav_ratio_mean"])
        # The one replica acknowledged the version the step's samples came from.
        assert (r["replicas_on_version"], r["replicas_seen"]) == (1, 1), r["step"]
    # Async: the producer generated the next batch while the learner trained, never 2 versions behind.
    assert max(r["staleness_max"] for r in grpo[LEARN_STEPS:]) == 1
    # The samples of the learner's current version (the first resumed batch is all of them: generated
    # on the restored weights, pushed over the gloo group) still give pi_learner / pi_behaviour = 1.
    fresh = [r["behav_ratio_fresh"] for r in grpo if "behav_ratio_fresh" in r]
    assert len(fresh) > LEARN_STEPS and all(abs(x - 1.0) < 0.02 for x in fresh), fresh
    rewards = first["config"]["reward"]["rewards"]
    for r in grpo[
        LEARN_STEPS:
    ]:  # reward = the configured verifier rewards + 0.5 reward model, per sample, so in the mean too
        expected = sum(w["weight"] * r[f"score_{w['name']}"] for w in rewards) + 0.5 * r["score_rm"]
        assert abs(r["reward_mean"] - expected) < 1e-4, (r["reward_mean"], expected)
    assert all("score_rm" not in r for r in grpo[:LEARN_STEPS])
    assert len({r["score_rm"] for r in grpo[LEARN_STEPS:]}) == 3, "the reward model scored every batch differently"
    trained = [json.loads(x) for x in (run / "trained_samples.jsonl").read_text().splitlines()]
    per_step = first["config"]["algo"]["prompts_per_step"] * first["config"]["algo"]["group_size"]
    assert [t["step"] for t in trained] == steps and all(len(t["ids"]) == per_step for t in trained)
    # No file of the run (config.yaml, report.json, logs, metrics, checkpoints, wandb's offline run)
    # holds the token.
    assert list(run.glob("wandb/offline-run-*")), "wandb wrote its offline run into the run folder"
    leaks = [p for p in run.rglob("*") if p.is_file() and RUN_SECRET.encode() in p.read_bytes()]
    assert not leaks, leaks
    prompts = [p.split("#")[0] for t in trained for p in t["ids"]]
    assert len(set(prompts)) == total * first["config"]["algo"]["prompts_per_step"], (
        "each step draws new prompts; none is replayed after the resume"
    )


@pytest.mark.slow
def test_shm_weights_to_replicas_on_another_node_fail_before_anything_starts(cluster, tmp_path):
    """Node-local shm weights with the learner and the replicas pinned to different nodes would
    leave the replicas serving version 0 for ever: the job fails at once and names the fix."""
    t0 = time.time()
    proc = subprocess.run(
        [
            sys.executable,
            "pipelines/grpo.py",
            "--run.storage_path",
            str(tmp_path),
            "--run.wandb_mode",
            "disabled",
            "--rollout.weights.transport",
            "shm",
            *PINNED,
        ],
        cwd=ROOT,
        env=cluster.head.env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0 and time.time() - t0 < 60
    err = proc.stderr.strip().splitlines()[-1]
    assert err.startswith("raypost: no node can hold a learner worker"), proc.stderr[-3000:]
    for fix in ("rollout.weights.transport=object_store", "rollout.ray_resources", "rollout.weights.shared=true"):
        assert fix in err
    assert not list(tmp_path.glob("*/base_model")), "it failed before the data phase"


def test_a_failed_run_removes_its_serve_apps(monkeypatch, tmp_path):
    """The GRPO pipeline removes its Serve apps and pushed weights when training raises, and the
    error still reaches the caller (phases, Serve and the start gate replaced by fakes: the order
    of calls is the logic). Runs through the ``raypost`` command as ``pipelines/grpo.py`` does."""
    from raypost.cli import run_pipeline
    from raypost.phases import data as data_phase
    from raypost.phases import grpo as grpo_phase
    from raypost.serve import apps
    from tests.unit.phases.test_served import FakeGate

    calls: list[str] = []

    def fail(*_a, **_k):
        calls.append("train")
        raise RuntimeError("learner died")

    class Channel:
        def close(self) -> None:
            calls.append("close weights")

    monkeypatch.setattr(data_phase, "start_run", lambda cfg, verbose: tmp_path)
    monkeypatch.setattr(data_phase, "prepare", lambda *a: ("base", None))
    monkeypatch.setattr(grpo_phase, "check_placement", lambda cfg: None)
    monkeypatch.setattr(grpo_phase, "warmup", lambda *a: ("warm", 0.0))
    monkeypatch.setattr(grpo_phase, "weight_channel", lambda cfg: Channel())
    monkeypatch.setattr(grpo_phase.StartGate, "create", lambda timeout_s: FakeGate())
    monkeypatch.setattr(grpo_phase, "started_here", lambda: False)
    monkeypatch.setattr(apps, "start", lambda *a: None)
    monkeypatch.setattr(apps, "deploy", lambda targets, *a: calls.append("deploy " + ",".join(t.name for t in targets)))
    monkeypatch.setattr(apps, "delete", lambda names, wait: calls.append(f"delete {','.join(names)} wait={wait}"))
    monkeypatch.setattr(grpo_phase, "evaluate", lambda *a, **k: calls.append("evaluate") or {"accuracy": 0.0})
    monkeypatch.setattr(grpo_phase, "train", fail)
    with pytest.raises(RuntimeError, match="learner died"):
        run_pipeline("grpo", [])
    # the deploy and the held-out pass run on a thread beside the learner's start
    deploy = "deploy grpo-rollout,grpo-reward"
    assert calls[0] == "close weights" and sorted(calls[1:4]) == [deploy, "evaluate", "train"]
    assert calls.index(deploy) < calls.index("evaluate")
    assert calls[4:] == ["delete grpo-rollout,grpo-reward wait=True", "close weights"]
