"""Phases of the distillation job: the teacher, the student, the modes, evaluation.

A mode is a function ``(cfg, teacher_path, student_path, data, out) -> SFTResult`` registered
in ``MODES`` under the name ``distill.mode`` takes; ``out`` is the student's run folder (its
checkpoints, metrics and mode data). Every mode trains the student with the SFT learner; they
differ in what the student fits.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from raypost.algos.distill import KDParams
from raypost.algos.registry import Registry
from raypost.config import ModelConfig, SFTConfig
from raypost.config.distill import DistillConfig
from raypost.data.teacher import TeacherSignal
from raypost.models.named import resolve
from raypost.phases import data as data_phase
from raypost.phases.data import PreparedData
from raypost.phases.sft import SFTResult, run_sft

log = logging.getLogger("raypost")
MODES = Registry("distillation mode")


@dataclass
class Phase:
    model_path: str
    wall_s: float  # 0 when a re-run found the phase finished
    info: dict[str, Any] = field(default_factory=dict)  # what the phase wants in report.json


def once(marker: Path, make: Callable[[], SFTResult]) -> Phase:
    """Run a training phase once: a finished phase leaves ``marker``, and a resumed job
    reuses its model instead of training again."""
    if marker.is_file():
        done = json.loads(marker.read_text())
        return Phase(done["model_path"], 0.0, done.get("info", {}))
    t0 = time.time()
    result = make()
    wall = time.time() - t0  # all of it: data passes, teacher generation, replicas, training
    info = result.metrics.get("mode_info", {})
    marker.write_text(json.dumps({"model_path": result.model_path, "wall_s": wall, "info": info}))
    return Phase(result.model_path, wall, info)


def student_sft(cfg: DistillConfig, out: Path) -> SFTConfig:
    """The SFT learner's config for a student run stored in the folder ``out``."""
    return SFTConfig(
        model=cfg.model,
        data=cfg.data,
        optim=cfg.optim,
        deepspeed=cfg.deepspeed,
        resources=cfg.resources,
        eval=cfg.eval,
        train=cfg.train,
        run=cfg.run.model_copy(update={"name": out.name, "storage_path": str(out.parent)}),
    )


def teacher(cfg: DistillConfig, base_path: str, data: PreparedData, run_dir: Path) -> Phase:
    """``teacher.path`` as is, or SFT-trained here on the task's demos (``teacher.data``, else
    the run's): the tiny base model (no path), or the model at ``teacher.path`` with
    ``teacher.finetune``."""
    t = cfg.teacher
    if t.path is not None and not t.finetune:
        return Phase(t.path, 0.0)
    model = ModelConfig(tiny=t.tiny) if t.path is None else ModelConfig(path=t.path)
    sft_cfg = SFTConfig(
        model=model,
        data=t.data or cfg.data,
        optim=cfg.teacher.optim,
        deepspeed=cfg.deepspeed,
        resources=cfg.resources,
        eval=cfg.eval,
        train=cfg.teacher.train,
        run=cfg.run.model_copy(update={"name": "teacher", "storage_path": str(run_dir)}),
    )

    def make() -> SFTResult:
        own = data
        if t.data is not None:  # tokenized with the base model's tokenizer; its rejects kept apart
            (run_dir / "teacher_data").mkdir(parents=True, exist_ok=True)
            _, own = data_phase.prepare(t.data, ModelConfig(path=base_path), run_dir / "teacher_data")
        return run_sft(sft_cfg, base_path, own, run_dir / "teacher")

    return once(run_dir / "teacher_done.json", make)


def same_tokenizer(teacher_path: str, student_path: str) -> None:
    """Distillation here compares token ids position by position: one tokenizer for both."""
    from raypost.models.hf import load_tokenizer

    t, s = load_tokenizer(teacher_path), load_tokenizer(student_path)
    tv, sv = t.get_vocab(), s.get_vocab()
    if tv != sv or t.eos_token_id != s.eos_token_id:
        differ = sum(1 for k, v in tv.items() if sv.get(k) != v)
        raise ValueError(
            f"the teacher ({teacher_path}) and student ({student_path}) tokenizers differ: "
            f"{len(tv)} vs {len(sv)} tokens, {differ} teacher tokens with another id or none, eos "
            f"{t.eos_token_id} vs {s.eos_token_id}. Distillation needs one tokenizer: pick a student "
            f"of the teacher's family (e.g. Qwen2.5-0.5B for a Qwen2.5-7B teacher)"
        )


def student_base(cfg: DistillConfig, teacher_path: str, run_dir: Path) -> str:
    """``model.path`` (checked to share the teacher's tokenizer), or a student built from the
    teacher (``student.init``: its architecture at ``model.tiny``'s shape, or its pruned copy)."""
    if cfg.model.path is not None:
        same_tokenizer(teacher_path, cfg.model.path)
        return cfg.model.path
    from raypost.models import student

    out = run_dir / "student_base"
    if cfg.student.init == "prune":
        return str(student.pruned(teacher_path, cfg.student.keep_every, out, cfg.student.keep_layers))
    return str(student.from_config(teacher_path, cfg.model.tiny, out))


def student_info(cfg: DistillConfig, teacher_path: str, student_path: str) -> dict[str, Any]:
    """The student's and teacher's shapes (and a pruned student's kept layers), for the report."""
    from raypost.models import student

    info: dict[str, Any] = {
        "init": "path" if cfg.model.path else cfg.student.init,
        "student": student.describe(student_path),
        "teacher": student.describe(teacher_path),
    }
    if info["init"] == "prune":
        info["kept_layers"] = student.kept_layers(
            info["teacher"]["num_layers"], cfg.student.keep_every, cfg.student.keep_layers
        )
    return info


def check_placement(cfg: DistillConfig) -> None:
    """The run's peak fits the cluster; on-policy: the pushed student weights can reach its replica."""
    from raypost.train.trainer import worker_resources
    from raypost.utils.cluster import check_one_node, check_resources
    from raypost.weights import check_weight_path, default_transport

    check_resources({"resources (learner) or the teacher (distill.teacher_cpus, rollout)": peak_request(cfg)})
    worker = worker_resources(cfg.resources)
    check_one_node(worker, "learner worker (resources.cpus_per_worker, gpus_per_worker, ray_resources)")
    if cfg.distill.mode in ("on_policy", "seq_kd"):
        replica = {
            "CPU": cfg.rollout.cpus_per_replica,
            "GPU": cfg.rollout.gpus_per_replica,
            **cfg.rollout.ray_resources,
        }
        check_one_node(replica, "rollout replica (rollout.cpus_per_replica, gpus_per_replica, ray_resources)")
    if cfg.distill.mode == "on_policy":
        default_transport(cfg.rollout)
        check_weight_path(cfg.rollout, worker, replica)


def peak_request(cfg: DistillConfig) -> dict[str, float]:
    """The most a distillation run holds at once. Its phases run one after another: the
    learner, then (offline_kd) the teacher-pass actor, (seq_kd) the teacher's vLLM replica, or
    (on_policy) the learner beside a student and a teacher replica."""
    from raypost.train.trainer import learner_request

    learner = learner_request(cfg.resources)
    replica = {"CPU": cfg.rollout.cpus_per_replica, "GPU": cfg.rollout.gpus_per_replica, **cfg.rollout.ray_resources}
    if cfg.distill.mode == "offline_kd":
        other = {"CPU": cfg.distill.teacher_cpus}
    elif cfg.distill.mode == "seq_kd":
        other = replica
    else:
        other = {k: learner.get(k, 0.0) + 2 * v for k, v in replica.items()}
    need = {k: max(learner.get(k, 0.0), other.get(k, 0.0)) for k in {*learner, *other}}
    return {k: v for k, v in need.items() if v > 0}


def num_params(model_path: str) -> int:
    """Parameters in an HF folder's safetensors files (read from their headers)."""
    from safetensors import safe_open

    total = 0
    for f in Path(resolve(model_path)).glob("*.safetensors"):
        with safe_open(str(f), "pt") as fh:
            for key in fh.keys():  # noqa: SIM118 - safe_open is not iterable
                n = 1
                for d in fh.get_slice(key).get_shape():
                    n *= d
                total += n
    return total


def kd_signal(cfg: DistillConfig, teacher_path: str, cache: dict[str, Any] | None = None) -> TeacherSignal:
    """Offline KD's teacher pass settings and the loss's KD parameters (``cache``: see TeacherSignal)."""
    d = cfg.distill
    kd = KDParams(
        divergence=d.divergence, beta=d.beta, temperature=d.temperature, kd_weight=d.kd_weight, positions=d.kd_positions
    )
    return TeacherSignal(teacher_path, d.top_k, asdict(kd), cfg.deepspeed.precision, d.teacher_cpus, cache=cache)


@MODES.register("offline_kd")
def offline_kd(cfg: DistillConfig, teacher_path: str, student_path: str, data: PreparedData, out: Path) -> SFTResult:
    """The student fits the teacher's top-k log-probs, stored once by a Ray Data pass."""
    return run_sft(student_sft(cfg, out), student_path, data, out, teacher=kd_signal(cfg, teacher_path))


@MODES.register("seq_kd")
def seq_kd(cfg: DistillConfig, teacher_path: str, student_path: str, data: PreparedData, out: Path) -> SFTResult:
    """The student is SFT-trained on the teacher's completions, generated through Serve."""
    from raypost.phases.teacher_gen import teacher_completions

    out.mkdir(parents=True, exist_ok=True)
    train, counts = teacher_completions(cfg, teacher_path, data.train, out)
    sft_cfg = student_sft(cfg, out)
    if cfg.distill.seq_kd_epochs is not None:
        sft_cfg = sft_cfg.model_copy(
            update={"train": sft_cfg.train.model_copy(update={"epochs": cfg.distill.seq_kd_epochs})}
        )
    result = run_sft(sft_cfg, student_path, PreparedData(train, data.eval, data.counts), out)
    result.metrics["mode_info"] = {"seq_kd": counts}
    return result


@MODES.register("on_policy")
def on_policy(cfg: DistillConfig, teacher_path: str, student_path: str, data: PreparedData, out: Path) -> SFTResult:
    """The student samples on a Serve replica; a teacher replica scores its tokens. With
    distill.warm_start it starts from the baseline (trained once, next to ``out``)."""
    from raypost.phases.onpolicy import run_on_policy

    if cfg.distill.warm_start:
        student_path = baseline(cfg, student_path, data, out.parent).model_path
    return run_on_policy(cfg, teacher_path, student_path, data, out)


def distill(cfg: DistillConfig, teacher_path: str, student_path: str, data: PreparedData, run_dir: Path) -> Phase:
    make = lambda: MODES.get_fn(cfg.distill.mode)(cfg, teacher_path, student_path, data, run_dir / "student")  # noqa: E731
    return once(run_dir / "student_done.json", make)


def baseline(cfg: DistillConfig, student_path: str, data: PreparedData, run_dir: Path) -> Phase:
    """Plain SFT of the same student on the gold answers."""
    out = run_dir / "baseline"
    make = lambda: run_sft(student_sft(cfg, out), student_path, data, out)  # noqa: E731
    return once(run_dir / "baseline_done.json", make)


def evaluate(cfg: DistillConfig, model_path: str, data: PreparedData) -> dict[str, Any]:
    """Held-out greedy accuracy (eval.engine: transformers, or a vLLM replica with the rollout settings)."""
    from raypost.eval import heldout_accuracy

    t0 = time.time()
    out = heldout_accuracy(model_path, data.eval_rows(cfg.data.max_eval_samples), cfg.eval, cfg.rollout)
    return {**out, "params": num_params(model_path), "eval_s": time.time() - t0}
