"""On-policy distillation: raypost (student samples on Serve vLLM, teacher replica scores,
DeepSpeed learner) vs TRL GKDTrainer (transformers generation, teacher forward in-process).

One identical workload through both: the same teacher, the same warm student (raypost's
baseline: the student SFT-trained on the gold answers), the same prompts in the same order,
one sample per prompt, prompts per step, max_new_tokens, steps, lr (constant), temperature
1.0, and the generalized JSD with beta 0.5 (GKD with lambda = 1: only on-policy samples).
raypost computes the JSD on the teacher's top-k (``--top-k``) at each sampled position, TRL
on the full vocabulary.

1. raypost runs first, as a user runs it (``pipelines/distill.py --distill.mode on_policy``
   in a child process, with its own local Ray cluster). Its teacher and baseline are the
   start for both (``--teacher`` reuses a trained teacher; otherwise the run trains one).
2. TRL GKDTrainer trains the same student on the prompts raypost trained on, in order, in one
   process with all cores.
3. The teacher, the warm student and both final students are evaluated by one function: greedy
   held-out accuracy on the same rows. raypost's own report figures are kept beside them.

    .venv/bin/python -m benchmarks.distill_vs_trl [--teacher runs/distill/teacher/<ckpt>/hf] [--steps 20]
    .venv/bin/python -m benchmarks.distill_vs_trl --config examples/distill_smollm2.yaml   # SmolLM2 teacher
    .venv/bin/python -m benchmarks.distill_vs_trl --config examples/distill_smollm2.yaml -- --train.max_steps 40

Prints a table and writes benchmarks/out/distill_vs_trl[_<config>].json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import OUT, ROOT, TRL_ON_CPU, flags, step_timer, table


def run_raypost(args: argparse.Namespace, out: Path) -> dict:
    """pipelines/distill.py (on_policy, GKD loss) on its own local cluster."""
    run = out / "raypost"
    shutil.rmtree(run, ignore_errors=True)
    over = {
        "run.storage_path": out,
        "run.name": "raypost",
        "run.wandb_mode": "disabled",
        "run.checkpoint_every": 1000000,
        "run.log_every": 1,
        "data.max_eval_samples": args.eval_n,
        "distill.mode": "on_policy",
        "distill.on_policy_loss": "gkd",
        "distill.divergence": "jsd",
        "distill.beta": 0.5,
        "distill.top_k": args.top_k,
        "distill.samples_per_prompt": 1,
        "distill.prompts_per_step": args.prompts,
        "distill.on_policy_steps": args.steps,
        "distill.max_new_tokens": args.max_new_tokens,
        "distill.on_policy_optim.lr": args.lr,
        "distill.on_policy_optim.micro_batch_size": args.prompts // 2,
    }
    cmd = [sys.executable, "pipelines/distill.py", *flags(over)]
    if args.config:
        cmd += ["--config", args.config]
    if args.teacher:
        cmd += ["--teacher.path", args.teacher, "--teacher.finetune", "false"]
    cmd += args.overrides
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"raypost run failed:\n{proc.stderr[-5000:]}")
    rows = [json.loads(x) for x in (run / "student" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("phase") == "on_policy"]
    report = json.loads((run / "report.json").read_text())
    trained = [json.loads(x)["ids"] for x in (run / "student" / "trained_samples.jsonl").read_text().splitlines()]
    return {
        "step_s": [r["step_s"] for r in steps],
        "gen_tokens": [r["response_len"] * args.prompts for r in steps],
        "accuracy": report["heldout_accuracy"],
        "teacher": report["teacher_path"],
        "student": json.loads((run / "baseline_done.json").read_text())["model_path"],
        "final": report["model_path"],
        "trained_ids": trained,
        "run": run,
        "job_wall_s": time.time() - t0,
    }


def prompt_rows(run: Path, trained_ids: list[list[str]]) -> list[dict]:
    """The prompts raypost trained on, in order, as GKD's chat 'messages' (the gold answer last:
    GKD's collator builds the prompt from every message but the last; lambda = 1 never trains on it)."""
    from raypost.config import load_config
    from raypost.config.distill import DistillConfig
    from raypost.data.sources import synthetic_rows

    data = load_config(DistillConfig, [], path=run / "config.yaml").data
    by_id = {r["id"]: r for r in synthetic_rows(data, "train")}
    return [
        {
            "messages": [
                {"role": "user", "content": by_id[sid.split("#")[0]]["question"]},
                {"role": "assistant", "content": by_id[sid.split("#")[0]]["answer"]},
            ]
        }
        for ids in trained_ids
        for sid in ids
    ]


def run_trl(args: argparse.Namespace, student: str, teacher: str, rows: list[dict], out: Path) -> dict:
    import torch
    from datasets import Dataset
    from trl.experimental.gkd import GKDConfig, GKDTrainer

    from raypost.models.hf import load_causal_lm, load_tokenizer

    torch.set_num_threads(os.cpu_count() or 1)
    step_s: list[float] = []
    cfg = GKDConfig(
        output_dir=str(out / "trl"),
        per_device_train_batch_size=args.prompts,
        max_steps=args.steps,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        adam_beta2=0.95,
        max_grad_norm=1.0,
        lmbda=1.0,
        beta=0.5,
        temperature=1.0,
        max_new_tokens=args.max_new_tokens,
        train_sampling_strategy="sequential",
        **TRL_ON_CPU,
        max_length=256,
    )
    trainer = GKDTrainer(
        model=load_causal_lm(student),
        teacher_model=load_causal_lm(teacher),
        args=cfg,
        train_dataset=Dataset.from_list(rows),
        processing_class=load_tokenizer(student),
        callbacks=[step_timer(step_s)],
    )
    t0 = time.time()
    trainer.train()
    final = out / "trl" / "final"
    trainer.save_model(str(final))
    load_tokenizer(student).save_pretrained(str(final))
    return {"step_s": step_s, "wall_s": time.time() - t0, "final": str(final)}


def heldout_accuracy(model: str, run: Path, n: int) -> float:
    """Greedy accuracy on the run's first ``n`` held-out rows, each normalized as the pipeline
    normalizes it (``answer`` = the final number; the raw synthetic row's ``answer`` is the
    worked solution, which ``answers_match`` would not take as gold)."""
    from raypost.config import load_config
    from raypost.config.distill import DistillConfig
    from raypost.data.rows import normalize_row
    from raypost.data.sources import synthetic_rows
    from raypost.data.tokenize import prompt_ids
    from raypost.eval.accuracy import accuracy
    from raypost.models.hf import load_tokenizer

    data = load_config(DistillConfig, [], path=run / "config.yaml").data
    tok = load_tokenizer(model)
    norm = [normalize_row(r, "question", "answer") for r in synthetic_rows(data, "eval")[:n]]
    rows = [{"prompt_ids": prompt_ids(tok, r["question"], None), "answer": r["answer"]} for r in norm]
    return accuracy(model, rows, 48, 64)["accuracy"]


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--config",
        default=None,
        help="a distill YAML (e.g. examples/distill_smollm2.yaml: SmolLM2 "
        "teacher, pruned student); default: the embedded tiny task",
    )
    ap.add_argument("--teacher", default=None, help="a trained teacher (HF folder); default: the run trains one")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--skip", type=int, default=2, help="first steps left out of the medians (start-up)")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--top-k", type=int, default=16)
    ap.add_argument("--eval-n", type=int, default=200)
    ap.add_argument("overrides", nargs="*", help="pipeline config overrides after --, e.g. -- --train.max_steps 40")
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    tag = "" if args.config is None else "_" + Path(args.config).stem
    out = OUT / f"distill_vs_trl{tag}"
    out.mkdir(parents=True, exist_ok=True)
    ours = run_raypost(args, out)
    theirs = run_trl(args, ours["student"], ours["teacher"], prompt_rows(ours["run"], ours["trained_ids"]), out)
    models = {
        "teacher": ours["teacher"],
        "warm student": ours["student"],
        "raypost": ours["final"],
        "TRL": theirs["final"],
    }
    acc = {name: heldout_accuracy(path, ours["run"], args.eval_n) for name, path in models.items()}
    ours_med, theirs_med = (statistics.median(r["step_s"][args.skip :]) for r in (ours, theirs))
    tok_s = sum(ours["gen_tokens"][args.skip :]) / sum(ours["step_s"][args.skip :])
    print(
        table(
            f"\nOn-policy distillation (GKD, JSD beta 0.5), {args.prompts} prompts x 1 sample, "
            f"{args.max_new_tokens} new tokens, {args.steps} steps; raypost/TRL step time = "
            f"{ours_med / theirs_med:.2f}",
            ["framework", "median step s", "held-out accuracy after"],
            [
                ["raypost", f"{ours_med:.2f}", f"{acc['raypost']:.3f}"],
                ["TRL GKDTrainer", f"{theirs_med:.2f}", f"{acc['TRL']:.3f}"],
            ],
        )
    )
    print(
        f"teacher {acc['teacher']:.3f}, warm student (start of both) {acc['warm student']:.3f}; "
        f"raypost gen tok/s of step time {tok_s:.0f}"
    )
    (OUT / f"distill_vs_trl{tag}.json").write_text(
        json.dumps(
            {
                "config": vars(args),
                "median_step_s": {"raypost": ours_med, "TRL": theirs_med},
                "step_time_ratio_raypost_over_trl": ours_med / theirs_med,
                "heldout_accuracy": acc,
                "raypost_report_accuracy": ours["accuracy"],
                "raypost_gen_tokens_per_s": tok_s,
                "step_s": {"raypost": ours["step_s"], "TRL": theirs["step_s"]},
                "raypost_job_wall_s": ours["job_wall_s"],
                "trl_wall_s": theirs["wall_s"],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
