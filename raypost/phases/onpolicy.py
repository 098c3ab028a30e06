"""On-policy distillation phase: a student replica and a teacher replica on Serve, and the
on-policy learner (``train.onpolicy_loop``) on Ray Train."""

from __future__ import annotations

import time
from pathlib import Path

from raypost.config.distill import DistillConfig
from raypost.data import preprocess
from raypost.phases.data import PreparedData
from raypost.phases.sft import SFTResult
from raypost.serve.apps import App, deployed, rollout
from raypost.train import checkpointing
from raypost.train.loop import LoopConfig
from raypost.train.onpolicy_loop import onpolicy_loop
from raypost.train.trainer import fit
from raypost.weights import WeightChannel, open_channel


def _apps(
    names: dict[str, str], teacher_path: str, student_path: str, cfg: DistillConfig, chan: WeightChannel
) -> list[App]:
    """The student replica serves the versions pushed through ``chan``; the teacher's stays as loaded."""
    return [
        rollout(names["student"], student_path, cfg.rollout, chan),
        rollout(names["teacher"], teacher_path, cfg.rollout),
    ]


def run_on_policy(cfg: DistillConfig, teacher_path: str, student_path: str, data: PreparedData, out: Path) -> SFTResult:
    d = cfg.distill
    key = f"{cfg.run.name}-{out.name}"  # the run's channel and apps, named after the run and phase
    chan, names = open_channel(cfg.rollout, key), {"student": f"{key}-student", "teacher": f"{key}-teacher"}
    chan.close()  # a resumed learner republishes its restored version
    prompts = preprocess.prompt_order(data.train, d.on_policy_steps * d.prompts_per_step, cfg.run.seed)
    seqs = d.prompts_per_step * d.samples_per_prompt
    t0 = time.time()
    with deployed(_apps(names, teacher_path, student_path, cfg, chan), cleanup=chan.close):
        # the final weights are in the checkpoint: the pushed ones go with the apps
        result = fit(
            onpolicy_loop,
            LoopConfig(
                cfg=cfg.model_dump(mode="json"),
                model_path=student_path,
                run_dir=str(out),
                total_steps=d.on_policy_steps,
                grad_accum=seqs // (cfg.resources.num_workers * d.on_policy_optim.micro_batch_size),
                channel=chan,
                apps=names,
            ),
            cfg.resources,
            cfg.run.model_copy(update={"storage_path": str(out.parent)}),
            {"prompts": prompts},
            name=out.name,
        )
    if result.error is not None:
        raise result.error
    return SFTResult(
        str(Path(result.checkpoint.path) / checkpointing.HF_DIR),
        d.on_policy_steps,
        time.time() - t0,
        dict(result.metrics or {}),
    )
