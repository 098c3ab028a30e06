"""A run whose Ray Train snapshot was torn (emptied by a full disk while Ray Train rewrote it)
resumes from its last checkpoint, on a real Ray Train worker group: before the last good copy,
every restart failed in Ray Train's CheckpointManager (found by the chaos `disk` drill). A run
whose first snapshot was the one torn starts over."""

from __future__ import annotations

from raypost.config.sections import ResourcesConfig, RunConfig


def _counting_loop(config: dict) -> None:
    """Two steps, a checkpoint after each, starting after the step the checkpoint holds."""
    import json
    import tempfile
    from pathlib import Path

    import ray.train

    from raypost.train.loop import LoopConfig

    loop = LoopConfig.of(config)
    start = 0
    if (ckpt := ray.train.get_checkpoint()) is not None:
        with ckpt.as_directory() as d:
            start = json.loads((Path(d) / "step.json").read_text())["step"]
    with open(Path(loop.run_dir) / "starts.jsonl", "a") as fh:
        fh.write(json.dumps({"start": start}) + "\n")
    for step in range(start + 1, start + 3):
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / "step.json").write_text(json.dumps({"step": step}))
            ray.train.report({"step": step}, checkpoint=ray.train.Checkpoint.from_directory(d))


def test_a_torn_run_snapshot_resumes_from_the_last_checkpoint(ray_cluster, tmp_path):
    import json

    from raypost.train.loop import LoopConfig
    from raypost.train.snapshot import SLOTS, SNAPSHOT
    from raypost.train.trainer import fit

    res = ResourcesConfig(num_workers=1, cpus_per_worker=0.5)
    run = RunConfig(storage_path=str(tmp_path), name="torn")
    loop = LoopConfig(cfg={}, model_path="unused", run_dir=str(tmp_path), total_steps=2)
    assert fit(_counting_loop, loop, res, run, {}).error is None
    snap = tmp_path / "torn" / SNAPSHOT
    copies = [json.loads((tmp_path / "torn" / s).read_text()) for s in SLOTS]
    assert json.loads(max(copies, key=lambda c: c["seq"])["snapshot"]) == json.loads(snap.read_text())
    snap.write_text("")  # what Ray Train's in-place rewrite leaves when the disk is full
    result = fit(_counting_loop, loop, res, run, {})
    assert result.error is None and result.metrics["step"] == 4
    starts = [json.loads(x)["start"] for x in (tmp_path / "starts.jsonl").read_text().splitlines()]
    assert starts == [0, 2]


def test_a_run_whose_first_snapshot_was_torn_starts_over(ray_cluster, tmp_path):
    import json

    from raypost.train.loop import LoopConfig
    from raypost.train.snapshot import SNAPSHOT, TORN
    from raypost.train.trainer import fit

    res = ResourcesConfig(num_workers=1, cpus_per_worker=0.5)
    run = RunConfig(storage_path=str(tmp_path), name="torn-first")
    (tmp_path / "torn-first").mkdir()
    (tmp_path / "torn-first" / SNAPSHOT).write_text('{"checkpoint_res')  # no checkpoint ever recorded whole
    loop = LoopConfig(cfg={}, model_path="unused", run_dir=str(tmp_path), total_steps=2)
    result = fit(_counting_loop, loop, res, run, {})
    assert result.error is None and result.metrics["step"] == 2
    assert [json.loads(x)["start"] for x in (tmp_path / "starts.jsonl").read_text().splitlines()] == [0]
    assert (tmp_path / "torn-first" / TORN).exists()
