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

Reported per framework: median wall time per step, generated tokens per second of step time,
and the reward of every step. The shape flag picks W1 (tiny, overhead-bound) or W2 (~100M
params, generation-bound).

    .venv/bin/python benchmarks/grpo_vs_trl.py [--shape tiny|100m] [--steps 12] [--group-size 8]

Prints a table and writes benchmarks/out/grpo_vs_trl_<shape>.json.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import OUT, ROOT, SHAPES, model_for, table  # noqa: E402

NUM_TRAIN = 2000


def run_raypost(args: argparse.Namespace, model: Path, out: Path) -> dict:
    """pipelines/grpo.py on its own local cluster; returns per-step metrics and the trained ids."""
    run = out / "raypost"
    shutil.rmtree(run, ignore_errors=True)
    cmd = [sys.executable, "pipelines/grpo.py", "--model", str(model), "--run.storage_path", str(out),
           "--run.name", "raypost", "--run.wandb_mode", "disabled", "--run.checkpoint_every", "1000000",
           "--data.synthetic.num_train", str(NUM_TRAIN), "--data.max_eval_samples", "32",
           "--warmup.train.max_steps", str(args.warmup_steps), "--algo.steps", str(args.steps),
           "--algo.group_size", str(args.group_size), "--algo.prompts_per_step", str(args.prompts),
           "--algo.max_new_tokens", str(args.max_new_tokens), "--algo.temperature", "1.0", "--algo.beta", "0",
           "--algo.loss", "grpo", "--optim.lr", str(args.lr), "--optim.micro_batch_size", str(args.micro_batch),
           "--rollout.weights_dir", f"/dev/shm/raypost-bench-{os.getpid()}"]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"raypost run failed:\n{proc.stderr[-5000:]}")
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("phase") == "grpo"]
    trained = [json.loads(x)["ids"] for x in (run / "trained_samples.jsonl").read_text().splitlines()]
    report = json.loads((run / "report.json").read_text())
    return {"step_s": [r["step_s"] for r in steps], "reward": [r["reward_mean"] for r in steps],
            "gen_tokens": [r["response_len"] * args.prompts * args.group_size for r in steps],
            "phase_s": report["phase_s"], "job_wall_s": time.time() - t0,
            "warm_model": json.loads((run / "warmup_done.json").read_text())["model_path"], "trained_ids": trained,
            "run": run}


def prompt_rows(run: Path, trained_ids: list[list[str]], group_size: int) -> list[dict]:
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
            rows.append({"prompt": [{"role": "user", "content": r["question"]}], "answer": final_answer(r["answer"])})
    return rows


def run_trl(args: argparse.Namespace, model: str, rows: list[dict], out: Path) -> dict:
    """TRL GRPOTrainer on the same model, prompts (unshuffled) and rewards."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from raypost.models.hf import load_causal_lm, load_tokenizer
    from raypost.rewards.verifiers import accuracy_reward

    torch.set_num_threads(os.cpu_count() or 1)
    step_s: list[float] = []
    history: list[dict] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            step_s.append(time.perf_counter() - self.t0)

        def on_log(self, a, state, control, logs=None, **kw):
            if logs and "reward" in logs:
                history.append(dict(logs))
    cfg = GRPOConfig(output_dir=str(out / "trl"), per_device_train_batch_size=args.prompts * args.group_size,
                     num_generations=args.group_size, max_completion_length=args.max_new_tokens, max_steps=args.steps,
                     learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0, adam_beta2=0.95,
                     max_grad_norm=1.0, beta=0.0, epsilon=0.2, loss_type="grpo", scale_rewards="group",
                     temperature=1.0, shuffle_dataset=False, use_cpu=True, bf16=False,
                     report_to="none", logging_steps=1, save_strategy="no", disable_tqdm=True, seed=0,
                     dataloader_num_workers=0, dataloader_pin_memory=False)
    trainer = GRPOTrainer(model=load_causal_lm(model), reward_funcs=[accuracy_reward], args=cfg,
                          train_dataset=Dataset.from_list(rows), processing_class=load_tokenizer(model),
                          callbacks=[Timer()])
    t0 = time.time()
    trainer.train()
    n = args.prompts * args.group_size
    return {"step_s": step_s, "reward": [r["reward"] for r in history],
            "gen_tokens": [r["completions/mean_length"] * n for r in history], "wall_s": time.time() - t0}


def summarize(name: str, res: dict, skip: int) -> dict:
    """Median step time and generated tokens per step-second over the steps after ``skip``."""
    steps = res["step_s"][skip:]
    toks = res["gen_tokens"][skip:]
    return {"framework": name, "median_step_s": statistics.median(steps),
            "gen_tokens_per_s": sum(toks) / sum(steps), "mean_reward": statistics.mean(res["reward"]),
            "reward_per_step": [round(r, 4) for r in res["reward"]]}


def main() -> None:
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
    args = ap.parse_args()
    out = OUT / f"grpo_vs_trl_{args.shape}"
    out.mkdir(parents=True, exist_ok=True)
    model = model_for(args.shape)
    ours = run_raypost(args, model, out)
    theirs = run_trl(args, ours["warm_model"], prompt_rows(ours["run"], ours["trained_ids"], args.group_size), out)
    rows = [summarize("raypost", ours, args.skip), summarize("TRL GRPOTrainer", theirs, args.skip)]
    ratio = rows[0]["median_step_s"] / rows[1]["median_step_s"]
    print(table(f"\nGRPO, {args.shape} model, {args.prompts} prompts x G={args.group_size}, {args.max_new_tokens} new "
                f"tokens, {args.steps} steps (medians skip {args.skip}); raypost/TRL step time = {ratio:.2f}",
                ["framework", "median step s", "gen tok/s", "mean reward"],
                [[r["framework"], f"{r['median_step_s']:.2f}", f"{r['gen_tokens_per_s']:.0f}",
                  f"{r['mean_reward']:.3f}"] for r in rows]))
    for r in rows:
        print(f"{r['framework']:16s} reward/step: {r['reward_per_step']}")
    (OUT / f"grpo_vs_trl_{args.shape}.json").write_text(json.dumps(
        {"config": vars(args), "results": rows, "step_time_ratio_raypost_over_trl": ratio,
         "raypost_phase_s": ours["phase_s"], "raypost_job_wall_s": ours["job_wall_s"],
         "trl_wall_s": theirs["wall_s"]}, indent=2))


if __name__ == "__main__":
    main()
