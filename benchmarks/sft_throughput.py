"""SFT throughput: raypost (1 and 2 Ray Train workers) vs TRL SFTTrainer vs a bare PyTorch loop.

All of them train the same tiny Qwen2 model (fp32) on the same synthetic examples, the
same max length and the same batch (``--batch`` examples per optimizer step, unpacked,
padded to the longest row), with AdamW at the same lr. tokens/s counts real (non-pad)
tokens; each figure is the median over the steps after ``--warmup``. raypost is also run
with packing, its default, as an extra row (same examples, fewer pad tokens).

    .venv/bin/python -m benchmarks.sft_throughput [--steps 20] [--warmup 5] [--batch 32]

Prints a table and writes benchmarks/out/sft_throughput.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from raypost.config import SFTConfig, TinyModelConfig, build
from raypost.data import completion_ids, prompt_ids, sft_example, synthetic
from raypost.models.hf import load_causal_lm, load_tokenizer
from raypost.models.tiny import build_tiny_model

LR = 1e-3


def examples(model_path: Path, n: int, seed: int) -> list[dict]:
    tok = load_tokenizer(model_path)
    rows = synthetic.generate(n, seed)
    return [sft_example(prompt_ids(tok, r["question"], None), completion_ids(tok, r["answer"])) for r in rows]


def padded(batch: list[dict], pad_id: int) -> dict[str, torch.Tensor]:
    t = max(len(e["input_ids"]) for e in batch)
    ids = torch.tensor([e["input_ids"] + [pad_id] * (t - len(e["input_ids"])) for e in batch])
    labels = torch.tensor([e["labels"] + [-100] * (t - len(e["labels"])) for e in batch])
    mask = torch.tensor([[1] * len(e["input_ids"]) + [0] * (t - len(e["input_ids"])) for e in batch])
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def bare_loop(model_path: Path, data: list[dict], batch: int, steps: int, warmup: int) -> float:
    """The floor: model + AdamW + clip, nothing else."""
    torch.set_num_threads(os.cpu_count() or 1)
    model, pad = load_causal_lm(model_path), load_tokenizer(model_path).pad_token_id
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95))
    rates = []
    for step in range(steps + warmup):
        chunk = data[step * batch : (step + 1) * batch]
        b = padded(chunk, pad)
        t0 = time.perf_counter()
        loss = model(**b).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step >= warmup:
            rates.append(sum(len(e["input_ids"]) for e in chunk) / (time.perf_counter() - t0))
    return statistics.median(rates)


def trl_sft(model_path: Path, data: list[dict], batch: int, steps: int, warmup: int, out: Path) -> float:
    """TRL SFTTrainer on the same pre-tokenized rows (input_ids + labels), no shuffling."""
    from datasets import Dataset
    from trl import SFTConfig as TRLConfig
    from trl import SFTTrainer

    from benchmarks.common import step_timer

    torch.set_num_threads(os.cpu_count() or 1)
    n = batch * (steps + warmup)
    ds = Dataset.from_list([{"input_ids": e["input_ids"], "labels": e["labels"]} for e in data[:n]])
    tokens = [sum(len(e["input_ids"]) for e in data[i * batch : (i + 1) * batch]) for i in range(steps + warmup)]
    times: list[float] = []

    args = TRLConfig(
        output_dir=str(out / "trl"),
        per_device_train_batch_size=batch,
        max_steps=steps + warmup,
        learning_rate=LR,
        adam_beta2=0.95,
        max_grad_norm=1.0,
        lr_scheduler_type="constant",
        max_length=256,
        packing=False,
        use_cpu=True,
        bf16=False,
        report_to="none",
        logging_steps=10**6,
        save_strategy="no",
        dataloader_num_workers=0,
        dataloader_pin_memory=False,
        seed=0,
        disable_tqdm=True,
        train_sampling_strategy="sequential",
    )
    trainer = SFTTrainer(
        model=load_causal_lm(model_path),
        args=args,
        train_dataset=ds,
        processing_class=load_tokenizer(model_path),
        callbacks=[step_timer(times)],
    )
    trainer.train()
    return statistics.median(t / dt for t, dt in zip(tokens[warmup:], times[warmup:]))


def raypost_sft(
    model_path: Path, out: Path, workers: int, batch: int, steps: int, warmup: int, pack: bool, num_train: int
) -> float:
    """The raypost SFT phase as a user runs it (Ray Data -> Ray Train + DeepSpeed ZeRO-2)."""
    from raypost.phases import data as data_phase
    from raypost.phases.sft import run_sft
    from raypost.utils.metrics import read_metrics

    name = f"raypost-w{workers}-{'packed' if pack else 'padded'}"
    micro = batch // workers if not pack else max(1, batch // (6 * workers))
    cfg = build(
        SFTConfig,
        {
            "model": {"path": str(model_path)},
            "data": {"pack": pack, "max_seq_len": 256, "synthetic": {"num_train": num_train, "num_eval": 16}},
            "optim": {"lr": LR, "micro_batch_size": micro, "scheduler": "constant", "warmup_ratio": 0.0},
            "deepspeed": {"zero_stage": 2},
            "resources": {"num_workers": workers, "cpus_per_worker": 0.5},
            "train": {"epochs": 1, "max_steps": steps + warmup},
            "run": {
                "name": name,
                "storage_path": str(out / "runs"),
                "log_every": 1,
                "checkpoint_every": 10**6,
                "wandb_mode": "disabled",
            },
        },
    )
    run_dir = out / "runs" / name
    run_dir.mkdir(parents=True, exist_ok=True)
    _, data = data_phase.prepare(cfg.data, cfg.model, run_dir)
    run_sft(cfg, str(model_path), data, run_dir)
    rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if "tokens_per_s" in r]
    return statistics.median(r["tokens_per_s"] for r in rows[warmup:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "out")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import shutil

    shutil.rmtree(args.out / "runs", ignore_errors=True)
    n = args.batch * (args.steps + args.warmup)
    corpus = synthetic.generate(2000, 1234)
    model_path = build_tiny_model(
        TinyModelConfig(), [r["question"] for r in corpus] + [r["answer"] for r in corpus], args.out / "tiny_model"
    )
    data = examples(model_path, n, seed=1234)
    load = os.getloadavg()[0]
    results = {
        "bare PyTorch loop": bare_loop(model_path, data, args.batch, args.steps, args.warmup),
        "TRL SFTTrainer": trl_sft(model_path, data, args.batch, args.steps, args.warmup, args.out),
    }
    from raypost.utils.cluster import init_ray

    init_ray()
    for workers in (1, 2):
        results[f"raypost, {workers} worker(s)"] = raypost_sft(
            model_path, args.out, workers, args.batch, args.steps, args.warmup, False, n
        )
    results["raypost, 2 workers, packed"] = raypost_sft(
        model_path, args.out, 2, args.batch, args.steps, args.warmup, True, n
    )
    bare, trl = results["bare PyTorch loop"], results["TRL SFTTrainer"]
    print(
        f"\nSFT throughput, tiny Qwen2 ({sum(p.numel() for p in load_causal_lm(model_path).parameters()) / 1e6:.1f}M), "
        f"batch {args.batch} examples, fp32, median of {args.steps} steps after {args.warmup} warm-up; "
        f"load before start {load:.2f}"
    )
    print(f"{'run':34s} {'tokens/s':>10s} {'vs TRL':>8s} {'vs bare':>8s}")
    for name, rate in results.items():
        print(f"{name:34s} {rate:10.0f} {rate / trl:8.2f} {rate / bare:8.2f}")
    (args.out / "sft_throughput.json").write_text(
        json.dumps(
            {
                "config": vars(args) | {"out": str(args.out)},
                "tokens_per_s": results,
                "load_before": load,
                "ratio_vs_trl": {k: v / trl for k, v in results.items()},
                "ratio_vs_bare": {k: v / bare for k, v in results.items()},
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
