"""GRPO step time: raypost (vLLM rollouts on Serve + DeepSpeed learner) vs TRL GRPOTrainer.

One identical workload through both: the same warmed-up model and tokenizer, the same prompts
in the same order, G completions per prompt, max_new_tokens, prompts per step, steps, lr,
temperature 1.0, beta 0, the GRPO loss (sequence mean, group std scaling, clip 0.2), and the
same reward function (raypost's accuracy verifier, the GRPO default; it has TRL's signature).

1. raypost runs first, as a user runs it (``pipelines/grpo.py`` in a child process, with its
   own local Ray cluster). Its SFT warm-up produces the starting model for both; its
   ``trained_samples.jsonl`` gives the prompt order TRL replays.
2. TRL GRPOTrainer (transformers generation: TRL's vLLM modes need a GPU) trains the same
   model on those prompts, unshuffled, one process with all cores.

With ``--model`` (a pretrained model, e.g. ``smollm2-135m-instruct``) there is no warm-up: both
start from the model itself, with ``--system`` as the system prompt and answers read the way
pretrained models write them (flexible extraction). A third row then gives the floor on this
machine: raw vLLM generation of the same prompts plus a bare PyTorch step on those rollouts
(``benchmarks/grpo_limit.py``, one after the other in one process).

Reported per framework: median wall time per step and its generate/train phases, generated
tokens per second of step time, and the reward of every step. The shape flag picks W1 (tiny,
overhead-bound) or W2 (~100M params, generation-bound).

    .venv/bin/python -m benchmarks.grpo_vs_trl [--shape tiny|100m] [--steps 12] [--group-size 8]
    .venv/bin/python -m benchmarks.grpo_vs_trl --model smollm2-135m-instruct --max-new-tokens 128 \
        --prompts 2 --steps 5 --skip 1 --micro-batch 8 --lr 1e-5

Prints a table and writes benchmarks/out/grpo_vs_trl_<shape or model>.json.
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
from typing import Any

from benchmarks.common import OUT, ROOT, SHAPES, TRL_ON_CPU, flags, model_for, table

NUM_TRAIN = 2000
FLEXIBLE = {
    "name": "accuracy",
    "fn": "accuracy",
    "weight": 1.0,
    "needs_labels": True,
    "kwargs": {"extract": "flexible"},
}
SYSTEM = (
    "You are a helpful math tutor. Solve the problem in one or two short sentences, then write "
    "'The answer is N.' where N is a number."
)  # the no-warm-up SmolLM2 run's (RESULTS.md)


def run_raypost(args: argparse.Namespace, model: Path, out: Path) -> dict:
    """pipelines/grpo.py on its own local cluster; returns per-step metrics and the trained ids."""
    run = out / "raypost"
    shutil.rmtree(run, ignore_errors=True)
    cmd = [sys.executable, "pipelines/grpo.py", *flags(_raypost_overrides(args, model, out))]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"raypost run failed:\n{proc.stderr[-5000:]}")
    return _read_run(run, args, model, time.time() - t0)


def _raypost_overrides(args: argparse.Namespace, model: str | Path, out: Path) -> dict[str, Any]:
    over: dict[str, Any] = {
        "model.path": model,
        "run.storage_path": out,
        "run.name": "raypost",
        "run.wandb_mode": "disabled",
        "run.checkpoint_every": 1000000,
        "data.synthetic.num_train": NUM_TRAIN,
        "data.max_eval_samples": 32,
        "warmup.train.max_steps": args.warmup_steps,
        "algo.steps": args.steps,
        "algo.group_size": args.group_size,
        "algo.prompts_per_step": args.prompts,
        "algo.max_new_tokens": args.max_new_tokens,
        "algo.beta": 0,
        "algo.loss": "grpo",
        "optim.lr": args.lr,
        "optim.micro_batch_size": args.micro_batch,
    }
    if args.model:  # a pretrained model: no warm-up, its chat template with the system prompt, flexible answers
        over.update(
            {
                "warmup.enabled": "false",
                "eval.extract": "flexible",
                "eval.max_new_tokens": args.max_new_tokens,
                "reward.rewards": json.dumps([FLEXIBLE]),
                "algo.temperature": args.temperature,
            }
        )
        if args.system:
            over["data.system_prompt"] = args.system
    return over


def _read_run(run: Path, args: argparse.Namespace, model: str | Path, wall_s: float) -> dict:
    """Per-step metrics, phase times and trained ids of raypost's finished run."""
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("phase") == "grpo"]
    trained = [json.loads(x)["ids"] for x in (run / "trained_samples.jsonl").read_text().splitlines()]
    report = json.loads((run / "report.json").read_text())
    warm = run / "warmup_done.json"
    return {
        "step_s": [r["step_s"] for r in steps],
        "reward": [r["reward_mean"] for r in steps],
        "gen_tokens": [r["response_len"] * args.prompts * args.group_size for r in steps],
        "generate_s": [r["generate_s"] for r in steps],
        "train_s": [r["train_s"] for r in steps],
        "push_s": [r["push_s"] for r in steps],
        "phase_s": report["phase_s"],
        "job_wall_s": wall_s,
        "warm_model": json.loads(warm.read_text())["model_path"] if warm.is_file() else str(model),
        "trained_ids": trained,
        "run": run,
    }


def prompt_rows(run: Path, trained_ids: list[list[str]], group_size: int, system: str | None) -> list[dict]:
    """The prompts raypost trained on, in order, as a TRL conversational dataset with an answer column."""
    from raypost.config import load_config
    from raypost.config.grpo import GRPOConfig
    from raypost.data.answers import final_answer
    from raypost.data.sources import synthetic_rows

    data = load_config(GRPOConfig, [], path=run / "config.yaml").data  # the task raypost's run generated
    by_id = {r["id"]: r for r in synthetic_rows(data, "train")}
    rows = []
    for ids in trained_ids:
        for sid in ids[::group_size]:
            r = by_id[sid.split("#")[0]]
            chat = ([{"role": "system", "content": system}] if system else []) + [
                {"role": "user", "content": r["question"]}
            ]
            rows.append({"prompt": chat, "answer": final_answer(r["answer"]), "question": r["question"]})
    return rows


def _trl_config(args: argparse.Namespace, out: Path) -> Any:
    """TRL's GRPOConfig for the same batch, loss and sampling as raypost's run."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(out / "trl"),
        per_device_train_batch_size=args.prompts * args.group_size,
        num_generations=args.group_size,
        max_completion_length=args.max_new_tokens,
        max_steps=args.steps,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        adam_beta2=0.95,
        max_grad_norm=1.0,
        beta=0.0,
        epsilon=0.2,
        loss_type="grpo",
        scale_rewards="group",
        temperature=args.temperature,
        shuffle_dataset=False,
        **TRL_ON_CPU,
    )


def run_trl(args: argparse.Namespace, model: str, rows: list[dict], out: Path) -> dict:
    """TRL GRPOTrainer on the same model, prompts (unshuffled) and rewards."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    from raypost.models.hf import load_causal_lm, load_tokenizer
    from raypost.rewards.verifiers import accuracy_reward

    torch.set_num_threads(os.cpu_count() or 1)
    step_s, gen_s, history = [], [], []

    class Timer(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            step_s.append(time.perf_counter() - self.t0)

        def on_log(self, a, state, control, logs=None, **kw):
            if logs and "reward" in logs:
                history.append(dict(logs))

    cfg = _trl_config(args, out)

    def flexible_accuracy(prompts, completions, answer, **kwargs):  # TRL names a reward by __name__
        return accuracy_reward(prompts, completions, answer, extract="flexible")

    reward = flexible_accuracy if args.model else accuracy_reward
    trainer = GRPOTrainer(
        model=load_causal_lm(model),
        reward_funcs=[reward],
        args=cfg,
        train_dataset=Dataset.from_list([{k: r[k] for k in ("prompt", "answer")} for r in rows]),
        processing_class=load_tokenizer(model),
        callbacks=[Timer()],
    )
    generate = trainer._generate_and_score_completions  # timed: the generation (and scoring) phase

    def timed(*a, **kw):
        t = time.perf_counter()
        try:
            return generate(*a, **kw)
        finally:
            gen_s.append(time.perf_counter() - t)

    trainer._generate_and_score_completions = timed
    t0 = time.time()
    trainer.train()
    n = args.prompts * args.group_size
    return {
        "step_s": step_s,
        "reward": [r["reward"] for r in history],
        "generate_s": gen_s,
        "train_s": [s - g for s, g in zip(step_s, gen_s)],
        "gen_tokens": [r["completions/mean_length"] * n for r in history],
        "wall_s": time.time() - t0,
    }


def run_limit(args: argparse.Namespace, model: str, rows: list[dict], out: Path) -> dict:
    """benchmarks/grpo_limit.py on the same prompts, step by step, in a child process."""
    from benchmarks.common import run_child
    from benchmarks.grpo_limit import MARK

    per_step = [
        [{"question": r["question"], "answer": r["answer"]} for r in rows[i : i + args.prompts]]
        for i in range(0, args.steps * args.prompts, args.prompts)
    ]
    (out / "limit_prompts.json").write_text(json.dumps(per_step))
    flags = [
        "--model",
        model,
        "--prompts-json",
        str(out / "limit_prompts.json"),
        "--group-size",
        str(args.group_size),
        "--max-new-tokens",
        str(args.max_new_tokens),
        "--temperature",
        str(args.temperature),
        "--micro-batch",
        str(args.micro_batch),
        "--lr",
        str(args.lr),
    ]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return run_child(
        ROOT / "benchmarks" / "grpo_limit.py",
        flags + (["--system", args.system] if args.system else []),
        base_env=env,
        timeout=3600,
        mark=MARK,
    )


def summarize(name: str, res: dict, skip: int) -> dict:
    """Median step time (and phases) and generated tokens per step-second over the steps after ``skip``."""
    steps = res["step_s"][skip:]
    toks = res["gen_tokens"][skip:]
    phases = {f"median_{k}": statistics.median(res[k][skip:]) for k in ("generate_s", "train_s", "push_s") if k in res}
    return {
        "framework": name,
        "median_step_s": statistics.median(steps),
        **phases,
        "gen_tokens_per_s": sum(toks) / sum(steps),
        "mean_reward": statistics.mean(res["reward"]),
        "reward_per_step": [round(r, 4) for r in res["reward"]],
    }


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--skip", type=int, default=2, help="first steps left out of the medians (start-up)")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--lr", type=float, default=5e-5, help="the GRPO default")
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--warmup-steps", type=int, default=60, help="raypost SFT warm-up steps (the shared start)")
    ap.add_argument(
        "--model",
        default=None,
        help="a pretrained model (path or raypost name) instead of --shape: "
        "no warm-up, flexible answers, and the limit row",
    )
    ap.add_argument("--system", default=None, help="--model: the system prompt (default: examples/grpo_smollm2.yaml's)")
    ap.add_argument("--temperature", type=float, default=None, help="sampling temperature (default 1.0; --model 0.7)")
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    if args.model:
        args.system = args.system or SYSTEM
    args.temperature = args.temperature or (0.7 if args.model else 1.0)
    tag = args.model.replace("/", "_") if args.model else args.shape
    out = OUT / f"grpo_vs_trl_{tag}"
    out.mkdir(parents=True, exist_ok=True)
    model = args.model or model_for(args.shape)
    ours = run_raypost(args, model, out)
    prompts = prompt_rows(ours["run"], ours["trained_ids"], args.group_size, args.system)
    start = ours["warm_model"]
    if args.model:
        from raypost.models.named import resolve

        start = resolve(args.model)
    theirs = run_trl(args, start, prompts, out)
    rows = [summarize("raypost", ours, args.skip), summarize("TRL GRPOTrainer", theirs, args.skip)]
    if args.model:
        limit = run_limit(args, start, prompts, out)
        from benchmarks.grpo_limit import summarize as summarize_limit

        rows.append({**summarize_limit(limit, args.skip), "mean_reward": None, "reward_per_step": []})
    report(args, tag, rows, ours, theirs)


def report(args: argparse.Namespace, tag: str, rows: list[dict], ours: dict, theirs: dict) -> None:
    """The comparison table, and its JSON in benchmarks/out."""
    ratio = rows[0]["median_step_s"] / rows[1]["median_step_s"]
    vs_limit = rows[0]["median_step_s"] / rows[2]["median_step_s"] if args.model else None
    print(
        table(
            f"\nGRPO, {tag} model, {args.prompts} prompts x G={args.group_size}, {args.max_new_tokens} new "
            f"tokens, {args.steps} steps (medians skip {args.skip}); raypost/TRL step time = {ratio:.2f}"
            + (f"; raypost/limit = {vs_limit:.2f}" if vs_limit else ""),
            ["framework", "median step s", "generate s", "train s", "gen tok/s", "mean reward"],
            [
                [
                    r["framework"],
                    f"{r['median_step_s']:.2f}",
                    f"{r.get('median_generate_s', float('nan')):.2f}",
                    f"{r.get('median_train_s', float('nan')):.2f}",
                    f"{r['gen_tokens_per_s']:.0f}",
                    "-" if r["mean_reward"] is None else f"{r['mean_reward']:.3f}",
                ]
                for r in rows
            ],
        )
    )
    for r in rows[:2]:
        print(f"{r['framework']:16s} reward/step: {r['reward_per_step']}")
    (OUT / f"grpo_vs_trl_{tag}.json").write_text(
        json.dumps(
            {
                "config": vars(args),
                "results": rows,
                "step_time_ratio_raypost_over_trl": ratio,
                "step_time_ratio_raypost_over_limit": vs_limit,
                "raypost_phase_s": ours["phase_s"],
                "raypost_job_wall_s": ours["job_wall_s"],
                "trl_wall_s": theirs["wall_s"],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
