"""One Tune trial = one run of a pipeline's phases on Ray Train, inside a function trainable.

Ray Train V2 forwards each checkpointed report to Tune (``trainer.fit`` adds
``TuneReportCallback`` inside a Tune session), so the scheduler sees the pipeline's own
metrics: SFT's ``eval_loss``, GRPO's ``reward_mean``. A trial's run is named by its trial id
under ``<sweep>/trials``, so a restored sweep resumes an unfinished trial from its checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from raypost.config import SFTConfig, StrictModel, dump_yaml
from raypost.config.distill import DistillConfig
from raypost.config.grpo import GRPOConfig
from raypost.train import checkpointing
from raypost.tune.space import PBT_MUTABLE, SpaceFile, trial_config

if TYPE_CHECKING:
    from raypost.phases.sft import SFTResult


def _sft(cfg: SFTConfig, run_dir: Path) -> None:
    from raypost.phases import data as data_phase
    from raypost.phases import sft as sft_phase

    model_path, data = data_phase.prepare(cfg.data, cfg.model, run_dir)
    sft_phase.run_sft(cfg, model_path, data, run_dir)


# One PBT segment: (the trial's config, the segment's run folder, the Train checkpoint to start
# from or None, the step to stop at) -> the segment's result.
Segment = Callable[[Any, Path, Optional[str], int], "SFTResult"]


def _sft_segments(cfg: SFTConfig, run_dir: Path) -> Segment:
    from raypost.phases import data as data_phase
    from raypost.phases import sft as sft_phase

    model_path, data = data_phase.prepare(cfg.data, cfg.model, run_dir)

    def segment(seg: SFTConfig, out: Path, start: str | None, stop: int) -> SFTResult:
        run = seg.run.model_copy(update={"storage_path": str(out.parent), "name": out.name})
        return sft_phase.run_sft(seg.model_copy(update={"run": run}), model_path, data, out, start_from=start,
                                 stop_at=stop, report_to_tune=False)
    return segment


def _offline_kd_segments(cfg: DistillConfig, run_dir: Path) -> Segment:
    """Offline KD from the sweep's shared teacher. The teacher pass runs once per trial; each
    segment sends the learner its own (possibly perturbed) KD parameters."""
    from raypost.config import ModelConfig
    from raypost.phases import data as data_phase
    from raypost.phases import distill as distill_phase
    from raypost.phases.sft import run_sft

    _, data = data_phase.prepare(cfg.data, ModelConfig(path=cfg.teacher.path), run_dir)
    student = distill_phase.student_base(cfg, cfg.teacher.path, run_dir)
    cache: dict[str, Any] = {}

    def segment(seg: DistillConfig, out: Path, start: str | None, stop: int) -> SFTResult:
        return run_sft(distill_phase.student_sft(seg, out), student, data, out,
                       teacher=distill_phase.kd_signal(seg, seg.teacher.path, cache), start_from=start,
                       stop_at=stop, report_to_tune=False)
    return segment


PBT_SEGMENTS: dict[str, Callable[[Any, Path], Segment]] = {"sft": _sft_segments, "distill": _offline_kd_segments}


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
            fh.write(json.dumps({"segment": name, "start_from": start, "step": step,
                                 **{k.split(".")[-1]: _dotted(cfg, k) for k in mutable}}) + "\n")
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


def _grpo(cfg: GRPOConfig, run_dir: Path) -> None:
    """GRPO from the sweep's shared warm-up model (see ``shared_start``)."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from raypost.phases import data as data_phase
    from raypost.phases import grpo as grpo_phase

    grpo_phase.check_placement(cfg)
    model_path, data = data_phase.prepare(cfg.data, cfg.model, run_dir)
    grpo_phase.reset_weights(cfg)
    # Tune captures a trial's child actors into its placement group, where Serve's controller
    # and replicas do not fit: deploy from a task scheduled outside it.
    outside = PlacementGroupSchedulingStrategy(placement_group=None)
    deploy = ray.remote(num_cpus=0, scheduling_strategy=outside)(grpo_phase.deploy)
    try:  # a trial that finishes or fails removes its apps (one Tune stops is killed: the next deploy replaces them)
        ray.get(deploy.remote(cfg, model_path, grpo_phase.weights_dir_for(cfg)))
        grpo_phase.train(cfg, model_path, data, run_dir)
    finally:
        grpo_phase.teardown(cfg)


def _distill(cfg: DistillConfig, run_dir: Path) -> None:
    """The distillation mode alone, from the sweep's shared teacher (see ``shared_start``)."""
    from raypost.config import ModelConfig
    from raypost.phases import data as data_phase
    from raypost.phases import distill as distill_phase

    _, data = data_phase.prepare(cfg.data, ModelConfig(path=cfg.teacher.path), run_dir)
    student = distill_phase.student_base(cfg, cfg.teacher.path, run_dir)
    # The student run is the trial's run folder itself, where Tune's restore looks for it.
    distill_phase.MODES.get_fn(cfg.distill.mode)(cfg, cfg.teacher.path, student, data, run_dir)


TRIAL_BODIES: dict[str, Callable[[Any, Path], None]] = {"sft": _sft, "grpo": _grpo, "distill": _distill}


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
    if spec.scheduler.type == "pbt":
        _pbt(cfg, run_dir, PBT_SEGMENTS[spec.pipeline](cfg, run_dir), PBT_MUTABLE[spec.pipeline])
    else:
        TRIAL_BODIES[spec.pipeline](cfg, run_dir)


def _grpo_warmup(space: SpaceFile, sweep_dir: Path) -> dict[str, Any]:
    cfg = trial_config(space, {})
    if not cfg.warmup.enabled:
        return {}
    from raypost.phases import data as data_phase
    from raypost.phases import grpo as grpo_phase

    run_dir = sweep_dir / "warmup"
    run_dir.mkdir(parents=True, exist_ok=True)
    model_path, data = data_phase.prepare(cfg.data, cfg.model, run_dir)
    warm, _ = grpo_phase.warmup(cfg, model_path, data, run_dir)
    return {"model": {"path": warm}, "warmup": {"enabled": False}}


def _distill_teacher(space: SpaceFile, sweep_dir: Path) -> dict[str, Any]:
    cfg = trial_config(space, {})
    if cfg.teacher.path is not None:
        return {"distill": {"baseline": False}}
    from raypost.config import ModelConfig
    from raypost.phases import data as data_phase
    from raypost.phases import distill as distill_phase

    run_dir = sweep_dir / "teacher"
    run_dir.mkdir(parents=True, exist_ok=True)
    base, data = data_phase.prepare(cfg.data, ModelConfig(path=cfg.teacher.path, tiny=cfg.teacher.tiny), run_dir)
    teacher = distill_phase.teacher(cfg, base, data, run_dir).model_path
    return {"teacher": {"path": teacher}, "distill": {"baseline": False}}


SHARED_STARTS: dict[str, Callable[[SpaceFile, Path], dict[str, Any]]] = {"grpo": _grpo_warmup,
                                                                         "distill": _distill_teacher}


def shared_start(space: SpaceFile, sweep_dir: Path) -> SpaceFile:
    """What every trial would otherwise repeat, done once in the driver: GRPO's SFT warm-up
    (trials start from it with warm-up off), distillation's teacher (trials get its path).
    Other pipelines return ``space`` unchanged."""
    if space.pipeline not in SHARED_STARTS:
        return space
    from raypost.config.base import deep_merge

    extra = SHARED_STARTS[space.pipeline](space, sweep_dir)
    return space.model_copy(update={"base": deep_merge(space.base, extra)}) if extra else space
