"""DPO on the policy's own pairs: raypost (Ray Train + DeepSpeed learner) vs TRL DPOTrainer.

One identical workload through both: the same starting model, the same pairs (the train split of
raypost's ``policy_pairs.jsonl``, token ids as sampled) in the order raypost trained them, the
same batch, steps, optimizer (AdamW, constant lr, clip), beta and sigmoid loss against a frozen copy of the start.

1. raypost runs first, as a user runs it (``raypost dpo --config CONFIG`` in a child process,
   with its own local Ray cluster); ``--run DIR`` reuses a finished run instead.
2. TRL DPOTrainer trains the same start on those pairs (its dataset preparation skipped, so the
   tokens are raypost's), in one process with all cores.
3. The start and both final models are evaluated by one function: greedy held-out accuracy
   (transformers) on the run's held-out questions. raypost's own vLLM figures are kept beside.

    .venv/bin/python -m benchmarks.dpo_vs_trl --config examples/dpo_policy_pairs_smollm2.yaml
    .venv/bin/python -m benchmarks.dpo_vs_trl --run /tmp/runs/dpo-smollm2-policy

Prints a table and writes benchmarks/out/dpo_vs_trl[_<run name>].json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import OUT, ROOT, TRL_ON_CPU, step_timer, table


def run_raypost(config: str, root: Path, seed: int) -> Path:
    """``raypost dpo --config config`` in a child process; returns its run folder."""
    name = f"{Path(config).stem}-s{seed}"
    cmd = [sys.executable, "-m", "raypost.cli", "dpo", "--config", config, "--run.seed", str(seed)]
    cmd += ["--run.name", name, "--run.storage_path", str(root), "--run.wandb_mode", "disabled"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-4000:]}")
    return root / name


def trained_pairs(run: Path) -> list[dict[str, Any]]:
    """The train pairs in the order raypost's learner took them (its trained_samples.jsonl)."""
    pairs = [json.loads(x) for x in (run / "policy_pairs.jsonl").read_text().splitlines() if x.strip()]
    by_id = {p["id"]: p for p in pairs if p["split"] == "train"}
    steps = [json.loads(x) for x in (run / "trained_samples.jsonl").read_text().splitlines() if x.strip()]
    return [by_id[i] for s in steps for i in s["ids"]]


def run_trl(start: str, pairs: list[dict[str, Any]], cfg: Any, out: Path) -> dict[str, Any]:
    """TRL DPOTrainer on ``pairs`` as given (no re-tokenizing, no shuffle)."""
    import torch
    from datasets import Dataset
    from torch.utils.data import SequentialSampler
    from trl import DPOConfig, DPOTrainer

    from raypost.models.hf import load_causal_lm, load_tokenizer

    class SameTokens(DPOTrainer):
        def _prepare_dataset(self, dataset, *args, **kwargs):  # raypost's token ids, as sampled
            return dataset

        def _get_train_sampler(self, *args, **kwargs):  # raypost's order
            return SequentialSampler(self.train_dataset)

    torch.set_num_threads(os.cpu_count() or 1)
    cols = ("prompt_ids", "chosen_ids", "rejected_ids")
    args = DPOConfig(
        output_dir=str(out / "trl"),
        per_device_train_batch_size=cfg.optim.micro_batch_size,
        gradient_accumulation_steps=cfg.optim.grad_accum,
        max_steps=len(pairs) // (cfg.optim.micro_batch_size * cfg.optim.grad_accum),
        learning_rate=cfg.optim.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=cfg.optim.weight_decay,
        max_grad_norm=cfg.optim.grad_clip,
        adam_beta1=cfg.optim.betas[0],
        adam_beta2=cfg.optim.betas[1],
        beta=cfg.dpo.beta,
        # RPO: TRL's "sft" term is the batch's token-mean NLL of the chosen; raypost's, each pair's mean
        loss_type=["sigmoid", "sft"] if cfg.dpo.nll_weight else ["sigmoid"],
        loss_weights=[1.0, cfg.dpo.nll_weight] if cfg.dpo.nll_weight else None,
        max_length=None,
        **TRL_ON_CPU,
        remove_unused_columns=False,
    )
    step_s: list[float] = []
    trainer = SameTokens(
        model=load_causal_lm(start),
        args=args,
        train_dataset=Dataset.from_list([{c: p[c] for c in cols} for p in pairs]),
        processing_class=load_tokenizer(start),
        callbacks=[step_timer(step_s)],
    )
    t0 = time.time()
    trainer.train()
    trainer.save_model(str(out / "trl" / "final"))
    load_tokenizer(start).save_pretrained(str(out / "trl" / "final"))
    losses = [float(h["loss"]) for h in trainer.state.log_history if "loss" in h and "train_loss" not in h]
    return {"step_s": step_s, "loss": losses, "wall_s": time.time() - t0, "model": str(out / "trl" / "final")}


def heldout_questions(cfg: Any, model: str) -> list[dict[str, Any]]:
    """The run's held-out questions (its synthetic task, regenerated from its config), as its
    evaluation reads them: the chat prompt's token ids and the final answer."""
    from raypost.data.answers import final_answer
    from raypost.data.sources import synthetic_rows
    from raypost.data.tokenize import prompt_ids
    from raypost.models.hf import load_tokenizer

    tok, d = load_tokenizer(model), cfg.data
    rows = list(synthetic_rows(d, "eval"))[: d.max_eval_samples]
    return [
        {
            "prompt_ids": prompt_ids(tok, r["question"], d.system_prompt, d.prompt_template),
            "answer": final_answer(r["answer"]),
        }
        for r in rows
    ]


def accuracy_of(model: str, questions: list[dict], cfg: Any) -> float:
    from raypost.eval.accuracy import accuracy

    ev = cfg.eval
    return accuracy(model, questions, ev.max_new_tokens, ev.batch_size, extract=ev.extract)["accuracy"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="examples/dpo_policy_pairs_smollm2.yaml")
    ap.add_argument("--run", type=Path, default=None, help="a finished raypost DPO run with policy pairs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip", type=int, default=1, help="first steps left out of the medians (start-up)")
    args = ap.parse_args()

    from raypost.config import load_config
    from raypost.config.dpo import DPOConfig
    from raypost.models.named import resolve

    run = args.run or run_raypost(args.config, OUT / "dpo_vs_trl_runs", args.seed)
    cfg = load_config(DPOConfig, [], path=run / "config.yaml")
    report = json.loads((run / "report.json").read_text())
    ours = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    ours_step = [r["train_s"] for r in ours if "train_s" in r]  # the learner's step, as TRL's is timed
    out = OUT / f"dpo_vs_trl_{run.name}"
    out.mkdir(parents=True, exist_ok=True)
    start = resolve(report["base_model"])
    theirs = run_trl(start, trained_pairs(run), cfg, out)
    questions = heldout_questions(cfg, start)
    acc = {who: accuracy_of(m, questions, cfg) for who, m in (("start", start), ("raypost", report["model_path"]))}
    acc["TRL DPOTrainer"] = accuracy_of(theirs["model"], questions, cfg)
    rows = [
        ["raypost", statistics.median(ours_step[args.skip :]), acc["start"], acc["raypost"]],
        ["TRL DPOTrainer", statistics.median(theirs["step_s"][args.skip :]), acc["start"], acc["TRL DPOTrainer"]],
    ]
    result = {
        "run": str(run),
        "pairs_trained": len(trained_pairs(run)),  # pairs x epochs
        "steps": {"raypost": len(ours_step), "TRL DPOTrainer": len(theirs["step_s"])},
        "median_step_s": {r[0]: r[1] for r in rows},
        "step_ratio_raypost_over_trl": rows[0][1] / rows[1][1],
        "heldout_accuracy_transformers": acc,
        "raypost_vllm_heldout": {k: report["heldout_accuracy"][k]["accuracy"] for k in ("before", "after")},
        "step_s": {"raypost": ours_step, "TRL DPOTrainer": theirs["step_s"]},
        "loss": {"raypost": [r["loss"] for r in ours if "train_s" in r], "TRL DPOTrainer": theirs["loss"]},
    }
    (OUT / f"dpo_vs_trl_{run.name}.json").write_text(json.dumps(result, indent=1))
    print(table("DPO on the policy's own pairs", ["", "median step s", "held-out before", "after"], rows))
    print(f"raypost step / TRL step: {result['step_ratio_raypost_over_trl']:.2f}")


if __name__ == "__main__":
    main()
