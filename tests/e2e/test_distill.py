"""Distillation: the teacher top-k pass, the
tokenizer check, and both modes end to end on a real Ray cluster (seq_kd through a Serve
vLLM teacher replica)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from tests.conftest import TINY, run_pipeline

IGNORE = -100


def test_teacher_pass_matches_unpacked_forward(tiny_model):
    """Top-k of a packed row equals each example's own forward pass (attention kept per example)."""
    from raypost.data.teacher import TeacherTopK
    from raypost.models.hf import load_causal_lm

    a, b = [5, 9, 14, 3, 7], [11, 4, 8, 20]
    row = {
        "input_ids": a + b,
        "labels": [IGNORE] + a[1:] + [IGNORE] + b[1:],
        "position_ids": list(range(len(a))) + list(range(len(b))),
        "segment_ids": [1] * len(a) + [2] * len(b),
    }
    out = TeacherTopK(str(tiny_model), top_k=4)(pd.DataFrame([row]))
    ids = torch.tensor(out["teacher_ids"][0]).reshape(-1, 4)
    logp = torch.tensor(out["teacher_logprobs"][0]).reshape(-1, 4)
    model = load_causal_lm(tiny_model).eval()
    with torch.no_grad():
        alone = [torch.log_softmax(model(input_ids=torch.tensor([x])).logits[0], -1) for x in (a, b)]
    expected_v, expected_i = torch.cat(alone).topk(4, dim=-1)
    assert torch.equal(ids, expected_i)
    assert torch.allclose(logp, expected_v, atol=1e-4)


def test_student_shares_teacher_tokenizer_or_fails(tiny_model, tmp_path):
    from raypost.config import TinyModelConfig
    from raypost.config.distill import DistillConfig
    from raypost.models.hf import load_tokenizer
    from raypost.models.tiny import build_tiny_model
    from raypost.phases.distill import same_tokenizer, student_base

    cfg = DistillConfig.model_validate(
        {"model": {"tiny": {"hidden_size": 32, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64}}}
    )
    student = student_base(cfg, str(tiny_model), tmp_path)
    assert load_tokenizer(student).get_vocab() == load_tokenizer(tiny_model).get_vocab()
    same_tokenizer(str(tiny_model), student)  # no error
    other = build_tiny_model(TinyModelConfig(**TINY), ["completely different text " * 50], tmp_path / "other")
    with pytest.raises(ValueError, match="tokenizers differ"):
        same_tokenizer(str(tiny_model), str(other))


def test_config_errors_name_the_field():
    from raypost.config import ConfigError, load_config
    from raypost.config.distill import DistillConfig

    with pytest.raises(ConfigError, match="mode"):
        load_config(DistillConfig, ["--distill.mode", "on_policy_typo"])
    with pytest.raises(ConfigError, match="beta"):
        load_config(DistillConfig, ["--distill.beta", "1.0"])
    with pytest.raises(ConfigError, match="divergence"):
        load_config(DistillConfig, ["--distill.divergance", "jsd"])
    with pytest.raises(ConfigError, match="distill.warm_start"):
        load_config(DistillConfig, ["--distill.mode", "on_policy", "--distill.baseline", "false"])
    with pytest.raises(ConfigError, match=r"multiple of resources.num_workers x distill.on_policy_optim"):
        load_config(DistillConfig, ["--distill.mode", "on_policy", "--distill.prompts_per_step", "3"])


def test_a_teacher_with_finetune_is_sft_trained_once_before_distilling(monkeypatch, tmp_path):
    """teacher.finetune: the model at teacher.path is SFT-trained (teacher.train, teacher.optim)
    and the trained export is the teacher; a finished fine-tune is reused; without finetune
    the path is the teacher as is."""
    from raypost.config.distill import DistillConfig
    from raypost.phases import distill as phases
    from raypost.phases.sft import SFTResult

    calls = []

    def fake_sft(cfg, model_path, data, out):  # the learner itself is tested end to end below
        calls.append(
            {
                "model": cfg.model.path,
                "base": model_path,
                "steps": cfg.train.max_steps,
                "lr": cfg.optim.lr,
                "out": out,
                "data": data,
            }
        )
        return SFTResult(str(out / "ckpt" / "hf"), 3, 1.0)

    monkeypatch.setattr(phases, "run_sft", fake_sft)
    cfg = DistillConfig.model_validate(
        {"teacher": {"path": "org/teacher", "finetune": True, "train": {"max_steps": 3}, "optim": {"lr": 1e-4}}}
    )
    first = phases.teacher(cfg, "org/teacher", "run data", tmp_path)
    assert calls == [
        {
            "model": "org/teacher",
            "base": "org/teacher",
            "steps": 3,
            "lr": 1e-4,
            "out": tmp_path / "teacher",
            "data": "run data",
        }
    ]
    assert first.model_path == str(tmp_path / "teacher" / "ckpt" / "hf") and first.wall_s > 0
    again = phases.teacher(cfg, "org/teacher", None, tmp_path)
    assert len(calls) == 1 and again.model_path == first.model_path and again.wall_s == 0.0
    as_is = cfg.model_copy(update={"teacher": cfg.teacher.model_copy(update={"finetune": False})})
    assert phases.teacher(as_is, "org/teacher", None, tmp_path / "other").model_path == "org/teacher"
    assert len(calls) == 1

    # teacher.data: the teacher learns from its own demos (tokenized with the base model), not the run's
    prepared = []

    def fake_prepare(data_cfg, model_cfg, out):
        prepared.append((data_cfg.synthetic.guess_fraction, model_cfg.path, out))
        return model_cfg.path, "teacher data"

    monkeypatch.setattr(phases.data_phase, "prepare", fake_prepare)
    own = DistillConfig.model_validate(
        {
            "data": {"synthetic": {"guess_fraction": 0.5}},
            "teacher": {"path": "org/teacher", "finetune": True, "data": {"synthetic": {"guess_fraction": 0.0}}},
        }
    )
    phases.teacher(own, "org/base", "run data", tmp_path / "own")
    assert prepared == [(0.0, "org/base", tmp_path / "own" / "teacher_data")]
    assert calls[-1]["data"] == "teacher data" and calls[-1]["base"] == "org/base"


# Head size 32 (64 / 2): the smallest vLLM's CPU attention supports (the on-policy student is served).
STUDENT = {"hidden_size": 64, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64}


def distill_args(storage: Path, name: str, *extra: str) -> list[str]:
    args = [
        "--run.storage_path",
        str(storage),
        "--run.name",
        name,
        "--run.log_every",
        "2",
        "--run.wandb_mode",
        "disabled",
        "--data.synthetic.num_train",
        "400",
        "--data.synthetic.num_eval",
        "16",
        "--data.max_seq_len",
        "96",
        "--teacher.train.max_steps",
        "160",
        "--teacher.train.epochs",
        "8",
        "--teacher.optim.lr",
        "3e-3",
        "--train.max_steps",
        "24",
        "--optim.lr",
        "3e-3",
        "--eval.max_new_tokens",
        "16",
        "--resources.num_workers",
        "2",
        "--resources.cpus_per_worker",
        "0.5",
        *extra,
    ]
    for key, value in TINY.items():
        args += [f"--teacher.tiny.{key}", str(value)]
    for key, value in STUDENT.items():
        args += [f"--model.tiny.{key}", str(value)]
    return args


@pytest.fixture(scope="module")
def offline_run(ray_cluster, tmp_path_factory) -> Path:
    storage = tmp_path_factory.mktemp("distill")
    run_pipeline("distill.py", distill_args(storage, "kd", "--distill.top_k", "8"), ray_cluster)
    return storage / "kd"


@pytest.mark.slow
def test_offline_kd_end_to_end(offline_run, ray_cluster):
    report = json.loads((offline_run / "report.json").read_text())
    assert report["mode"] == "offline_kd" and set(report["heldout_accuracy"]) == {"teacher", "baseline", "student"}
    assert report["params"]["student"] < 0.6 * report["params"]["teacher"]
    assert report["params"]["student"] == report["params"]["baseline"]
    rows = [json.loads(x) for x in (offline_run / "student" / "metrics.jsonl").read_text().splitlines()]
    kd = [r for r in rows if "kd" in r]
    assert len(kd) == 12, "a kd line every 2 of 24 steps"
    # The student moves toward the teacher: less divergence, more agreement with its top-1.
    assert kd[-1]["kd"] < 0.7 * kd[0]["kd"]
    assert kd[-1]["top1_agreement"] > kd[0]["top1_agreement"] + 0.1
    assert (offline_run / "loss.png").stat().st_size > 1000
    # The teacher pass's cost is in the report, and its top-k is on disk at that size.
    import pyarrow.parquet as pq

    cost = report["data"]["teacher_pass"]
    topk = pq.read_table(offline_run / "student" / "teacher_topk")
    assert cost["top_k"] == 8 and cost["seconds"] > 0 and cost["per_step_s"] == pytest.approx(cost["seconds"] / 24)
    assert cost["tokens"] == sum(len(x) for x in topk.column("teacher_ids").to_pylist()) // 8 > 0
    assert cost["bytes"] == sum(f.stat().st_size for f in (offline_run / "student" / "teacher_topk").rglob("*.parquet"))
    # The pass annotates only the packed rows that the 24 steps train on.
    from raypost.config import load_config
    from raypost.config.distill import DistillConfig

    cfg = load_config(DistillConfig, [], path=offline_run / "config.yaml")
    assert topk.num_rows == 24 * cfg.optim.micro_batch_size * cfg.optim.grad_accum * cfg.resources.num_workers
    assert all(r["step_s"] > 0 for r in rows if "loss" in r)
    # Re-running the same command trains nothing again: every phase was finished.
    run_pipeline("distill.py", distill_args(offline_run.parent, "kd", "--distill.top_k", "8"), ray_cluster)
    again = json.loads((offline_run / "report.json").read_text())
    assert again["model_path"] == report["model_path"] and set(again["phase_s"].values()) == {0.0}


@pytest.mark.slow
def test_seq_kd_trains_on_the_teachers_answers(offline_run, ray_cluster, serve_url, tmp_path):
    # serve_url: Serve is started (HTTP on a free port) before the pipeline deploys into it, as
    # it is for the HTTP tests that share this cluster later.
    from raypost.eval.accuracy import greedy_completions
    from raypost.models.hf import load_causal_lm, load_tokenizer

    teacher = json.loads((offline_run / "report.json").read_text())["teacher_path"]
    run_pipeline(
        "distill.py",
        distill_args(
            tmp_path,
            "seq",
            "--teacher.path",
            teacher,
            "--distill.mode",
            "seq_kd",
            "--distill.baseline",
            "false",
            "--distill.seq_kd_max_prompts",
            "32",
            "--distill.seq_kd_keep",
            "all",
            "--train.max_steps",
            "8",
            "--distill.max_new_tokens",
            "64",
            "--rollout.cpus_per_replica",
            "1",
        ),
        ray_cluster,
    )
    lines = (tmp_path / "seq" / "student" / "teacher_completions.jsonl").read_text().splitlines()
    counts, rows = json.loads(lines[0]), [json.loads(x) for x in lines[1:]]
    assert counts["prompts"] == 32 and counts["kept"] == len(rows) > 0
    assert counts["kept"] + counts["unfinished"] + counts["too_long"] == 32
    # The student's targets are the teacher's own greedy answers (vLLM on Serve = transformers).
    tok, model = load_tokenizer(teacher), load_causal_lm(teacher)
    sample = rows[:8]
    hf = greedy_completions(model, [r["prompt_ids"] for r in sample], tok.pad_token_id, tok.eos_token_id, 64, 8)
    assert sum(h == r["completion_ids"] for h, r in zip(hf, sample)) >= 7
    report = json.loads((tmp_path / "seq" / "report.json").read_text())
    assert report["mode"] == "seq_kd" and set(report["heldout_accuracy"]) == {"teacher", "student"}
    assert report["data"]["seq_kd"]["kept"] == counts["kept"]


@pytest.mark.slow
def test_on_policy_distills_through_serve(offline_run, ray_cluster, serve_url, tmp_path):
    """The student samples on its replica (weights pushed every step), the teacher replica
    scores those tokens with its top-k, and the GKD divergence to the teacher goes down."""
    teacher = json.loads((offline_run / "report.json").read_text())["teacher_path"]
    # From the untrained student (no baseline, no warm start): its reverse KL to the teacher is large.
    run_pipeline(
        "distill.py",
        distill_args(
            tmp_path,
            "onp",
            "--teacher.path",
            teacher,
            "--distill.mode",
            "on_policy",
            "--distill.baseline",
            "false",
            "--distill.warm_start",
            "false",
            "--distill.on_policy_steps",
            "10",
            "--distill.prompts_per_step",
            "8",
            "--distill.samples_per_prompt",
            "2",
            "--distill.max_new_tokens",
            "32",
            "--distill.on_policy_optim.lr",
            "3e-3",
            "--distill.on_policy_optim.micro_batch_size",
            "8",
            "--rollout.cpus_per_replica",
            "0.5",
            "--rollout.max_model_len",
            "160",
        ),
        ray_cluster,
    )
    run = tmp_path / "onp"
    steps = [json.loads(x) for x in (run / "student" / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if s.get("phase") == "on_policy"]
    assert [s["step"] for s in steps] == list(range(1, 11))
    # Each step's samples came from the weights pushed after the previous step...
    assert all(s["staleness_max"] == 0 and abs(s["ratio_mean"] - 1) < 1e-3 for s in steps)
    # ...and the student moved toward the teacher on its own samples (GKD's JSD on the top-k).
    first, last = sum(s["kd"] for s in steps[:3]) / 3, sum(s["kd"] for s in steps[-3:]) / 3
    assert last < 0.9 * first, (first, last)  # 1e-3 gave 4.72 -> 4.02 in 10 steps
    report = json.loads((run / "report.json").read_text())
    assert report["mode"] == "on_policy" and set(report["heldout_accuracy"]) == {"teacher", "student"}
