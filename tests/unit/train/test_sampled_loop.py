"""The step skeleton that GRPO and on-policy distillation share (``raypost.train.sampled``), one
step at a time on one rank, with its policies passed in and the push, the checkpoint and the
channel recorded instead of run (the real ones run in tests/e2e/test_grpo.py and tests/e2e/test_distill.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from raypost.config.grpo import GRPOConfig
from raypost.rl.records import Sequence
from raypost.train import checkpointing, sampled
from raypost.train.loop import LoopConfig


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple] = []


@pytest.fixture
def world(monkeypatch, tmp_path):
    rec = Recorder()

    class Channel:
        def stop_serving(self) -> None:
            rec.events.append(("stop_serving",))

        def served_versions(self) -> dict[str, int]:  # one replica, on the version last pushed
            return {"r0": max(e[1] for e in rec.events if e[0] == "push")}

    def push(engine, zero, version, chan, rank, bucket_mb):
        rec.events.append(("push", version, bucket_mb))
        return 0.01

    monkeypatch.setattr(sampled, "push_weights", push)
    monkeypatch.setattr(
        checkpointing,
        "save_and_report",
        lambda engine, state, metrics, rank, exporter, run_dir, extra=None: rec.events.append(
            ("checkpoint", state.step)
        ),
    )
    monkeypatch.setattr(checkpointing, "hf_exporter", lambda *a: "export")
    cfg = GRPOConfig.model_validate(
        {"run": {"checkpoint_every": 2, "wandb_mode": "disabled", "log_every": 1}, "rollout": {"weight_bucket_mb": 8}}
    )
    config = LoopConfig(cfg={}, model_path="unused", run_dir=str(tmp_path), total_steps=3, channel=Channel())
    return rec, cfg, config, tmp_path


def sampler(rec: Recorder, steps: int, fail_at: int | None = None) -> sampled.Sampler:
    def take(state):
        rec.events.append(("take", state.weight_version))
        state.cursor += 4
        return [Sequence(ids=[1, 2, 3], start=1, old=[-1.0, -1.0], sample_id=f"p{state.cursor}#0")], {"generate_s": 0.5}

    def learn(rows):
        if fail_at is not None and len([e for e in rec.events if e[0] == "learn"]) + 1 == fail_at:
            raise RuntimeError("learner failed")
        rec.events.append(("learn", len(rows)))
        return {"loss": 1.0}

    return sampled.Sampler(
        phase="grpo",
        label="grpo",
        steps=steps,
        shown=("loss",),
        take=take,
        learn=learn,
        extra=lambda seqs, m, step_s: {"tokens": float(len(seqs[0].ids))},
        start=lambda: rec.events.append(("start",)),
        advance=lambda v: rec.events.append(("advance", v)),
        stop=lambda: rec.events.append(("stop",)),
    )


def test_each_step_takes_learns_pushes_the_next_version_then_advances(world):
    rec, cfg, config, run_dir = world
    state = checkpointing.ControllerState(step=0, cursor=0, weight_version=0)
    sampled.run_steps(cfg, config, 0, 1, object(), SimpleNamespace(), state, sampler(rec, steps=3))
    assert rec.events == [
        ("push", 0, 8),
        ("start",),  # the replicas serve the restored weights before sampling starts
        ("take", 0),
        ("learn", 1),
        ("push", 1, 8),
        ("advance", 1),
        ("take", 1),
        ("learn", 1),
        ("push", 2, 8),
        ("advance", 2),
        ("checkpoint", 2),  # checkpoint_every 2
        ("take", 2),
        ("learn", 1),
        ("push", 3, 8),
        ("advance", 3),
        ("checkpoint", 3),  # and the last
        ("stop",),
        ("stop_serving",),
    ]
    assert (state.step, state.weight_version, state.cursor) == (3, 3, 12)
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and [r["weight_version"] for r in rows] == [1, 2, 3]
    assert all(r["phase"] == "grpo" and r["tokens"] == 3.0 and r["push_s"] == 0.01 for r in rows)
    assert all((r["replicas_on_version"], r["replicas_seen"]) == (1, 1) and 0 <= r["ack_s"] < 5 for r in rows)
    trained = [json.loads(x) for x in (run_dir / checkpointing.SAMPLES_FILE).read_text().splitlines()]
    assert [t["ids"] for t in trained] == [["p4#0"], ["p8#0"], ["p12#0"]]


def test_a_resumed_loop_starts_at_its_step_and_version(world):
    rec, cfg, config, _ = world
    state = checkpointing.ControllerState(step=2, cursor=8, weight_version=2)
    sampled.run_steps(cfg, config, 0, 1, object(), SimpleNamespace(), state, sampler(rec, steps=3))
    assert rec.events[:5] == [("push", 2, 8), ("start",), ("take", 2), ("learn", 1), ("push", 3, 8)]
    assert state.cursor == 12


def test_a_failing_step_still_stops_the_producer_and_the_weight_server(world):
    rec, cfg, config, _ = world
    state = checkpointing.ControllerState()
    with pytest.raises(RuntimeError, match="learner failed"):
        sampled.run_steps(cfg, config, 0, 1, object(), SimpleNamespace(), state, sampler(rec, steps=5, fail_at=2))
    assert rec.events[-2:] == [("stop",), ("stop_serving",)]
    assert state.step == 1
