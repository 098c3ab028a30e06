"""The one step skeleton every learner runs (``raypost.train.loop``), one step at a time on one
rank, with the learner's parts passed in and the checkpoint recorded instead of run (the real
ones run in tests/e2e/test_sft.py, tests/e2e/test_reward_model.py, tests/e2e/test_grpo.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from raypost.train import checkpointing, loop


@pytest.fixture
def checkpoints(monkeypatch):
    saved: list[tuple[int, dict]] = []
    monkeypatch.setattr(
        checkpointing,
        "save_and_report",
        lambda engine, state, metrics, rank, exporter, run_dir, extra=None: saved.append(
            (state.step, metrics, exporter)
        ),
    )
    monkeypatch.setattr(checkpointing, "hf_exporter", lambda *a: "export")
    return saved


def worker(tmp_path, log_every: int = 2, checkpoint_every: int = 3) -> loop.Worker:
    run = SimpleNamespace(log_every=log_every, checkpoint_every=checkpoint_every, wandb_mode="disabled", name="t")
    return loop.Worker(
        rank=0, engine=object(), tokenizer=object(), zero_stage=2, run_dir=str(tmp_path), run=run, config={}
    )


def global_batches(n: int, size: int = 4) -> list[dict[str, np.ndarray]]:
    return [
        {"x": np.arange(i * size, (i + 1) * size), "id": np.array([f"s{j}" for j in range(i * size, (i + 1) * size)])}
        for i in range(n)
    ]


def ids(index: int, batch: dict) -> list[str]:
    return [str(i) for i in batch["id"]]


def lines(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_a_dataset_learner_takes_its_rows_logs_at_its_cadence_and_checkpoints(tmp_path, checkpoints):
    state = checkpointing.ControllerState()
    learned: list[list[int]] = []

    def learn(rows):
        learned.append([int(r["x"]) for r in rows])
        return {"loss": float(len(learned))}

    def after(st, metrics, t0):
        return {"eval": 0.5} if st.step == 3 else {}

    learner = loop.Learner(
        phase="sft",
        label="sft",
        steps=5,
        take=loop.take_from(global_batches(9), state, 1, 2, ids),
        learn=learn,
        after=after,
        every_step=False,
        always=("eval",),
        shown=("loss",),
    )
    loop.run_learner(learner, worker(tmp_path), state)
    assert learned == [[1, 3], [5, 7], [9, 11], [13, 15], [17, 19]]  # rank 1 of 2: rows 1, 3 of each batch
    assert (state.step, state.cursor) == (5, 5)
    logged = lines(tmp_path / "metrics.jsonl")
    assert [(r["step"], sorted(k for k in r if k in ("loss", "eval"))) for r in logged] == [
        (2, ["loss"]),
        (3, ["eval"]),
        (4, ["loss"]),
        (5, ["loss"]),
    ]  # log_every 2, the last, and step 3's eval
    assert [(s, e) for s, _, e in checkpoints] == [(3, None), (5, "export")]  # every 3 and the last, exported
    trained = lines(tmp_path / checkpointing.SAMPLES_FILE)
    assert [t["ids"] for t in trained][:2] == [["s0", "s1", "s2", "s3"], ["s4", "s5", "s6", "s7"]]


def test_a_resumed_learner_skips_what_it_consumed_and_rewinds_its_logs(tmp_path, checkpoints):
    # The first run logged steps 1-4, its checkpoint is at 3: step 4 was trained by a lost state.
    (tmp_path / checkpointing.SAMPLES_FILE).write_text(
        "".join(json.dumps({"step": s, "ids": [f"s{4 * (s - 1)}"]}) + "\n" for s in range(1, 5))
    )
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "phase": "rm"}) + "\n" for s in range(1, 5)))
    state = checkpointing.ControllerState(step=3, cursor=3)
    learned = []
    learner = loop.Learner(
        phase="rm",
        label="rm",
        steps=5,
        take=loop.take_from(global_batches(9), state, 0, 1, ids),
        learn=lambda rows: learned.append(int(rows[0]["x"])) or {"loss": 1.0},
    )
    loop.run_learner(learner, worker(tmp_path), state)
    assert learned == [12, 16]  # batches 3 and 4: none repeated, none skipped
    trained = [t["step"] for t in lines(tmp_path / checkpointing.SAMPLES_FILE)]
    assert trained == [1, 2, 3, 4, 5]  # step 4 rewound, then trained again
    assert [r["step"] for r in lines(tmp_path / "metrics.jsonl")] == [1, 2, 3, 4, 5]


def test_stop_at_ends_after_its_checkpoint_and_data_that_runs_out_ends_the_loop(tmp_path, checkpoints):
    state = checkpointing.ControllerState()
    stopped = []
    learner = loop.Learner(
        phase="sft",
        label="sft",
        steps=10,
        take=loop.take_from(global_batches(9), state, 0, 1, ids),
        learn=lambda rows: {},
        stop_at=2,
        stop=lambda: stopped.append(True),
    )
    loop.run_learner(learner, worker(tmp_path, checkpoint_every=100), state)
    assert state.step == 2 and [s for s, _, _ in checkpoints] == [2] and stopped == [True]
    state = checkpointing.ControllerState(step=2, cursor=2)
    learner = loop.Learner(
        phase="sft",
        label="sft",
        steps=10,
        take=loop.take_from(global_batches(4), state, 0, 1, ids),
        learn=lambda rows: {},
    )
    loop.run_learner(learner, worker(tmp_path, checkpoint_every=100), state)
    assert (state.step, state.cursor) == (4, 4)  # 4 batches in all: the loop ends when they run out


def test_a_failing_step_still_stops_the_learner(tmp_path, checkpoints):
    state = checkpointing.ControllerState()
    stopped = []

    def learn(rows):
        raise RuntimeError("learner failed")

    learner = loop.Learner(
        phase="grpo",
        label="grpo",
        steps=3,
        take=loop.take_from(global_batches(3), state, 0, 1, ids),
        learn=learn,
        stop=lambda: stopped.append(True),
    )
    with pytest.raises(RuntimeError, match="learner failed"):
        loop.run_learner(learner, worker(tmp_path), state)
    assert stopped == [True] and state.step == 0


def test_a_long_phase_prints_about_ten_progress_lines_and_logs_every_cadence():
    """A 500-step warm-up at log_every 10 prints 10 progress lines, not 50, while its metrics
    are still logged every 10 steps."""
    import logging

    from raypost.utils.metrics import Progress

    printed, logged = [], []
    handler = logging.Handler()
    handler.emit = lambda record: printed.append(record.getMessage())
    progress_log = logging.getLogger("raypost.sft")
    progress_log.addHandler(handler)
    logger = SimpleNamespace(log=lambda metrics, step: logged.append(step))
    learner = loop.Learner(phase="sft", label="sft", steps=500, take=None, learn=None, every_step=False)
    try:
        for step in range(1, 501):
            loop._log(logger, Progress(500, 0, "sft"), learner, step, {"loss": 1.0}, log_every=10)
    finally:
        progress_log.removeHandler(handler)
    assert len(printed) == 10 and len(logged) == 50 and printed[-1].startswith("sft step 500/500")


def test_steps_are_full_global_batches_capped_and_none_is_an_error_naming_the_fields():
    from raypost.config import OptimConfig, ResourcesConfig
    from raypost.train.trainer import plan_steps

    optim, res = OptimConfig(micro_batch_size=4, grad_accum=2), ResourcesConfig(num_workers=2)
    assert plan_steps(100, optim, res, None, "pairs") == 6  # global batch 16: 6 full ones
    assert plan_steps(100, optim, res, 4, "pairs") == 4
    with pytest.raises(ValueError, match=r"15 training pairs make no full global batch of 16 \(optim.micro_batch_size"):
        plan_steps(15, optim, res, None, "pairs")
