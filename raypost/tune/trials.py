"""One Tune trial = one run of a pipeline's phases on Ray Train, inside a function trainable.

Ray Train V2 forwards each checkpointed report to Tune (``trainer.fit`` adds
``TuneReportCallback`` inside a Tune session), so the scheduler sees the pipeline's own
metrics: SFT's ``eval_loss``, GRPO's ``reward_mean``. A trial's run is named by its trial id
under ``<sweep>/trials``, so a restored sweep resumes an unfinished trial from its checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from raypost.config import StrictModel, dump_yaml
from raypost.config.base import deep_merge
from raypost.pipelines import registry
from raypost.pipelines.registry import Segment
from raypost.train import checkpointing
from raypost.tune.space import SpaceFile, trial_config


def _pbt(cfg: Any, run_dir: Path, segment: Segment, mutable: tuple[str, ...]) -> None:
    """PBT: the learner run in segments of run.checkpoint_every steps, one Tune report per
    segment with a Tune checkpoint that points at the segment's Train checkpoint. When PBT's
    exploit restarts this trial from a better trial's checkpoint (or Tune restores the sweep),
    the next segment starts from the pointed-to checkpoint with this trial's own, possibly
    perturbed, ``mutable`` params. Each segment is a fresh Train run, so nothing resumes the
    old lineage."""
    import tempfile
    import uuid

    from ray import tune

    start, step = _pbt_pointer(tune.get_checkpoint())
    while True:
        name = f"seg-{step:06d}-{uuid.uuid4().hex[:6]}"
        with open(run_dir / PBT_LOG, "a") as fh:  # the trial's lineage, one line per segment
            fh.write(
                json.dumps(
                    {
                        "segment": name,
                        "start_from": start,
                        "step": step,
                        **{k.split(".")[-1]: _dotted(cfg, k) for k in mutable},
                    }
                )
                + "\n"
            )
        result = segment(cfg, run_dir / name, start, step + cfg.run.checkpoint_every)
        start, step = result.checkpoint_path, int(result.metrics["step"])
        with tempfile.TemporaryDirectory(prefix="raypost-pbt-") as d:
            (Path(d) / PBT_POINTER).write_text(json.dumps({"train_checkpoint": start, "step": step}))
            tune.report({**result.metrics, "checkpoint_path": start}, checkpoint=tune.Checkpoint.from_directory(d))
        if step >= result.steps:
            return


PBT_POINTER = "pbt_pointer.json"
PBT_LOG = "pbt_segments.jsonl"


def _dotted(cfg: Any, key: str) -> Any:
    """``cfg``'s value at a dotted key (``optim.lr``)."""
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _pbt_pointer(ckpt: Any) -> tuple[str | None, int]:
    """(Train checkpoint, step) a PBT trial continues from; (None, 0) for a fresh trial."""
    if ckpt is None:
        return None, 0
    with ckpt.as_directory() as d:
        pointer = json.loads((Path(d) / PBT_POINTER).read_text())
    return pointer["train_checkpoint"], int(pointer["step"])


def trial_run_config(space: SpaceFile, params: dict[str, Any], trial_id: str, sweep_dir: str) -> StrictModel:
    """The trial's pipeline config: its run is ``<sweep>/trials/<trial_id>``."""
    cfg = trial_config(space, params)
    run = cfg.run.model_copy(update={"name": trial_id, "storage_path": str(Path(sweep_dir) / "trials")})
    return cfg.model_copy(update={"run": run})


def run_trial(params: dict[str, Any], space: dict[str, Any], sweep_dir: str) -> None:
    """Tune function trainable (bound with ``tune.with_parameters``)."""
    from ray import tune

    from raypost.utils.cluster import configure_ray_data
    from raypost.utils.logs import setup_logging

    setup_logging()
    configure_ray_data()
    spec = SpaceFile.model_validate(space)
    cfg = trial_run_config(spec, params, tune.get_context().get_trial_id(), sweep_dir)
    run_dir = Path(cfg.run.storage_path) / cfg.run.name
    done = checkpointing.finished_checkpoint(run_dir)
    if done is not None:
        # Restored after the driver died between this trial's last report and its end: hand
        # Tune the final result again instead of rerunning the trial.
        metrics = json.loads((done / checkpointing.METRICS_FILE).read_text())
        tune.report({**metrics, "checkpoint_path": str(done)})
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    dump_yaml(cfg, run_dir / "config.yaml")
    pipeline = registry.get(spec.pipeline)
    if spec.scheduler.type == "pbt":
        _pbt(cfg, run_dir, pipeline.pbt.segments(cfg, run_dir), pipeline.pbt.mutable)
    else:
        pipeline.trial(cfg, run_dir)


def shared_start(space: SpaceFile, sweep_dir: Path) -> SpaceFile:
    """What every trial would otherwise repeat, done once in the driver (the pipeline's
    ``shared_start``: GRPO's SFT warm-up, distillation's teacher); its overrides go into the
    space's base. Pipelines without one return ``space`` unchanged."""
    hook = registry.get(space.pipeline).shared_start
    extra = hook(trial_config(space, {}), sweep_dir) if hook is not None else {}
    return space.model_copy(update={"base": deep_merge(space.base, extra)}) if extra else space
