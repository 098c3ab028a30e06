"""Distillation modes side by side, at equal steps, from the same student (issue 23).

One Ray job, as ``pipelines/distill.py`` runs its phases, but every mode on the same teacher and
the same student start:

1. the teacher: ``teacher.path`` as is, or fine-tuned here on the task's demos (``teacher.finetune``);
2. the student start: built from the teacher once (``student.init``: pruned or from config);
3. for each seed, each mode trains that start for the same number of optimizer steps on the same
   training problems:
     sft         plain SFT on the task's demos (the baseline)
     kd_forward  offline logit KD, forward KL on the teacher's top-k (+ CE, distill.kd_weight)
     kd_jsd      offline logit KD, generalized JSD (beta = distill.beta)
     seq_kd      SFT on the teacher's own greedy answers to the training prompts
     on_policy   the student samples on Serve, a teacher replica scores (GKD, JSD on top-k)
4. greedy held-out accuracy of every model on the same rows: the teacher on a vLLM replica of its
   own, the start and every cell on one replica of the start, each cell's weights pushed to it.

The teacher pass (offline KD) and the teacher scoring (on-policy) are reported per step; the
top-k is written as Parquet and its size reported. Finished cells are kept (``seed<s>/<mode>.json``
in the run folder): re-running the command, with more seeds or modes, trains only what is missing.

    .venv/bin/python -m benchmarks.distill_compare                   # examples/distill_smollm2.yaml
    .venv/bin/python -m benchmarks.distill_compare --seeds 0 --modes sft kd_forward -- --train.max_steps 10
    .venv/bin/python -m benchmarks.distill_compare --styles     # + how each model answers (bare or worked)

Prints a table and writes benchmarks/out/distill_smollm2.json (``--out``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from benchmarks.common import OUT, ROOT, table

MODES: dict[str, dict[str, Any]] = {
    "sft": {},
    "kd_forward": {"mode": "offline_kd", "divergence": "forward_kl"},
    "kd_jsd": {"mode": "offline_kd", "divergence": "jsd"},
    "seq_kd": {"mode": "seq_kd"},
    "on_policy": {"mode": "on_policy", "warm_start": False},
}


def cell_config(cfg: Any, mode: str, seed: int) -> Any:
    """The run's config for one (mode, seed) cell."""
    distill = cfg.distill.model_copy(update=MODES[mode])
    return cfg.model_copy(update={"distill": distill, "run": cfg.run.model_copy(update={"seed": seed})})


def train_cell(cfg: Any, mode: str, teacher: str, start: str, data: Any, out: Path, cache: dict) -> Any:
    """Train one cell once (a finished cell is read back from its marker)."""
    from raypost.phases import distill as phases
    from raypost.phases.sft import run_sft

    def make() -> Any:
        if mode == "sft":
            return run_sft(phases.student_sft(cfg, out), start, data, out)
        if cfg.distill.mode == "offline_kd":
            return run_sft(
                phases.student_sft(cfg, out), start, data, out, teacher=phases.kd_signal(cfg, teacher, cache)
            )
        return phases.MODES.get_fn(cfg.distill.mode)(cfg, teacher, start, data, out)

    out.parent.mkdir(parents=True, exist_ok=True)
    if mode == "seq_kd":
        share_teacher_answers(cfg, out)
    return phases.once(out.parent / f"{out.name}_done.json", make)


def share_teacher_answers(cfg: Any, out: Path) -> None:
    """seq-KD's teacher answers the same training prompts greedily whatever the seed: a seed's
    cell reuses another seed's answers (``teacher_completions.jsonl``) instead of generating them."""
    if cfg.distill.seq_kd_temperature != 0.0 or (out / "teacher_completions.jsonl").is_file():
        return
    for other in sorted(out.parent.parent.glob("seed*/seq_kd/teacher_completions.jsonl")):
        out.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(other, out / "teacher_completions.jsonl")
        print(f"seq_kd: the teacher's answers reused from {other}", flush=True)
        return


def drop_optimizer_states(out: Path) -> None:
    """A finished cell keeps its HF export and drops DeepSpeed's states (1.3 GB for the 81M
    student): a comparison of 10 cells would otherwise hold 15 GB."""
    for ds in out.glob("checkpoint_*/ds"):
        shutil.rmtree(ds, ignore_errors=True)


def step_costs(out: Path, mode: str, info: dict) -> dict[str, float]:
    """Median step seconds of a cell (first step left out: start-up), and the teacher's share."""
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "step_s" in r][1:] or [r for r in rows if "step_s" in r]
    costs = {"step_s": statistics.median(r["step_s"] for r in steps), "steps": max(r["step"] for r in rows)}
    if mode == "on_policy":
        costs["teacher_s_per_step"] = statistics.median(r["teacher_s"] for r in steps)
        costs["generate_s_per_step"] = statistics.median(r["generate_s"] for r in steps)
    if "teacher_pass" in info:  # offline KD: the pass, spread over the steps (shared by a seed's KD cells)
        costs["teacher_s_per_step"] = info["teacher_pass"]["per_step_s"]
    if "seq_kd" in info:  # the teacher's answers, spread over the steps (generated once for all seeds)
        costs["teacher_s_per_step"] = info["seq_kd"]["generate_s"] / costs["steps"]
    return costs


def share_teacher_pass(cells: list[dict]) -> None:
    """A KD cell that reused its seed's teacher pass is charged the same pass per step as the
    cell that ran it: both stand for one KD run of that cost."""
    paid = {
        c["seed"]: c["teacher_s_per_step"]
        for c in cells
        if "teacher_pass" in c["info"] and not c["info"]["teacher_pass"]["reused"]
    }
    for c in cells:
        if "teacher_pass" in c["info"] and c["info"]["teacher_pass"]["reused"] and c["seed"] in paid:
            c["teacher_s_per_step"] = paid[c["seed"]]


def gold_fit(cfg: Any, models: dict[str, str], n: int = 64) -> dict[str, dict[str, float]]:
    """How each model fits the held-out gold solutions, teacher-forced: cross-entropy (nats per
    completion token), mean probability of the gold token, and entropy of the next-token
    distribution. A teacher that is near one-hot on the gold tokens gives KD little beyond CE."""
    import torch

    from raypost.data import prompt_ids
    from raypost.data.sources import synthetic_rows
    from raypost.data.tokenize import completion_ids
    from raypost.models.hf import load_causal_lm, load_tokenizer

    d = cfg.data
    rows = synthetic_rows(d, "eval")[:n]
    out = {}
    for name, path in models.items():
        tok, model = load_tokenizer(path), load_causal_lm(path).eval()
        ce = p_gold = entropy = 0.0
        count = 0
        for r in rows:
            prompt = prompt_ids(tok, r["question"], d.system_prompt, d.prompt_template)
            target = completion_ids(tok, r["answer"])
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([prompt + target])).logits[0, len(prompt) - 1 : -1].float()
            logp = torch.log_softmax(logits, -1)
            gold = logp.gather(1, torch.tensor(target)[:, None])[:, 0]
            ce, p_gold = ce - gold.sum().item(), p_gold + gold.exp().sum().item()
            entropy += -(logp.exp() * logp).sum(-1).sum().item()
            count += len(target)
        out[name] = {"ce": ce / count, "p_gold": p_gold / count, "entropy": entropy / count, "tokens": count}
    return out


def answer_styles(cfg: Any, models: dict[str, str], data: Any, run_dir: Path) -> dict[str, dict[str, float]]:
    """How each model answers the held-out questions, greedy: the share of bare answers (the
    completion starts with '####', as the guess demos do), of worked ones (a line with '='
    before the '####'), and the accuracy. Kept in ``<run>/styles.json``; a model already there is
    not evaluated again."""
    from raypost.eval import heldout_accuracy

    cache = run_dir / "styles.json"
    styles = json.loads(cache.read_text()) if cache.is_file() else {}
    n = cfg.data.max_eval_samples
    for name, path in models.items():
        if name in styles:
            continue
        ev = heldout_accuracy(path, data.eval_rows(n), cfg.eval, cfg.rollout, keep_samples=n)
        texts = [x["completion"].strip() for x in ev["samples"]]
        worked = [t for t in texts if "=" in t.split("####")[0]]
        styles[name] = {
            "bare": sum(t.startswith("####") for t in texts) / len(texts),
            "worked": len(worked) / len(texts),
            "accuracy": ev["accuracy"],
            "n": len(texts),
        }
        cache.write_text(json.dumps(styles, indent=1))
        print(f"{name}: {styles[name]}", flush=True)
    return styles


@contextlib.contextmanager
def shared_replica(cfg: Any, start: str, data: Any, run_dir: Path) -> Iterator[Callable[[str | None], dict]]:
    """Held-out accuracy of the student start and of every cell on one vLLM replica of the start,
    deployed on first use: a cell's HF weights are published to it as the next version, as a
    learner pushes (every cell has the start's architecture). A replica started per model spent
    about 35 of each evaluation's 55 s starting. ``evaluate(None)`` is the start itself (version 0).
    Used after all training: an idle replica would hold CPUs the on-policy cells place on."""
    from safetensors.torch import load_file

    from raypost.config.weights import ShmWeights
    from raypost.eval.accuracy import rollout_accuracy
    from raypost.phases.distill import num_params
    from raypost.serve.apps import deployed
    from raypost.serve.apps import rollout as rollout_app
    from raypost.serve.rollout_client import RolloutClient
    from raypost.weights import open_channel

    rows = data.eval_rows(cfg.data.max_eval_samples)
    rollout = cfg.rollout.model_copy(update={"weights": ShmWeights()})  # the driver is on the replica's node
    with contextlib.ExitStack() as stack:
        client, version = None, 0

        def evaluate(path: str | None) -> dict:
            nonlocal client, version
            t0 = time.time()
            if client is None:
                chan = open_channel(rollout, f"{cfg.run.name}-eval-cells")  # closed with the app: record and files
                stack.enter_context(deployed([rollout_app("eval-cells", start, rollout, chan)], cleanup=chan.close))
                client = RolloutClient("eval-cells", chan, rollout.max_attempts, chunk=cfg.eval.batch_size)
            if path is not None:
                version += 1
                client.update_weights(version, load_file(str(Path(path) / "model.safetensors")))
            out = rollout_accuracy(client, rows, cfg.eval.max_new_tokens, extract=cfg.eval.extract)
            if out["weight_version"] != version:
                raise RuntimeError(
                    f"the evaluation replica answered with version {out['weight_version']}, not {version}"
                )
            return {**out, "params": num_params(path or start), "eval_s": time.time() - t0}

        yield evaluate


def run(args: argparse.Namespace) -> dict:
    from raypost.config import ModelConfig, load_config
    from raypost.config.distill import DistillConfig
    from raypost.phases import data as data_phase
    from raypost.phases import distill as phases

    cfg = load_config(DistillConfig, ["--config", args.config, "--run.name", args.name, *args.overrides])
    run_dir = data_phase.start_run(cfg)
    t0 = time.time()
    base, data = data_phase.prepare(cfg.data, ModelConfig(path=cfg.teacher.path, tiny=cfg.teacher.tiny), run_dir)
    teacher = phases.teacher(cfg, base, data, run_dir)
    start = phases.student_base(cfg, teacher.model_path, run_dir)
    models = run_dir / "compare_models.json"  # the teacher's figures, kept for a re-run
    if not models.is_file():
        fit = gold_fit(cfg, {"teacher": teacher.model_path, "student start": start})
        models.write_text(
            json.dumps(
                {
                    "shapes": phases.student_info(cfg, teacher.model_path, start),
                    "gold_fit": fit,
                    # the fine-tune's own time, also when an earlier run of this command did it
                    "teacher": {
                        "path": teacher.model_path,
                        "finetune_s": _marker_wall(run_dir / "teacher_done.json"),
                        **_brief(phases.evaluate(cfg, teacher.model_path, data)),
                    },
                }
            )
        )
    result: dict[str, Any] = {
        "config": args.config,
        "overrides": args.overrides,
        "heldout_n": cfg.data.max_eval_samples,
        **json.loads(models.read_text()),
        "cells": [],
    }
    trained = train_cells(cfg, args, teacher.model_path, start, data, run_dir)
    with shared_replica(cfg, start, data, run_dir) as evaluate:
        start_record = run_dir / "start.json"
        if not start_record.is_file():
            start_record.write_text(json.dumps(_brief(evaluate(None))))
        result["start"] = json.loads(start_record.read_text())
        for (seed, mode), (phase, train_s) in trained.items():
            record = run_dir / f"seed{seed}" / f"{mode}.json"  # a finished cell, kept for a re-run
            if not record.is_file():
                acc = evaluate(phase.model_path)
                cell = {
                    "seed": seed,
                    "mode": mode,
                    **_brief(acc),
                    "train_wall_s": train_s,
                    "cell_wall_s": train_s + acc["eval_s"],
                    **step_costs(run_dir / f"seed{seed}" / mode, mode, phase.info),
                    "info": phase.info,
                }
                record.write_text(json.dumps(cell))
            result["cells"].append(json.loads(record.read_text()))
            print(f"seed {seed} {mode}: held-out {result['cells'][-1]['accuracy']:.3f}", flush=True)
    share_teacher_pass(result["cells"])
    if args.styles:
        models = {"teacher": teacher.model_path, "student start": start}
        for seed in args.seeds:
            for mode in args.modes:
                done = json.loads((run_dir / f"seed{seed}" / f"{mode}_done.json").read_text())
                models[f"seed{seed}/{mode}"] = done["model_path"]
        result["styles"] = answer_styles(cfg, models, data, run_dir)
    result["this_run_wall_s"] = time.time() - t0
    # The comparison's own time, whichever runs of the command did the work: the teacher's
    # fine-tune and evaluation, the start's evaluation and every cell (training and evaluation).
    t = result["teacher"]
    result["comparison_s"] = (
        t["finetune_s"] + t["eval_s"] + result["start"]["eval_s"] + sum(c["cell_wall_s"] for c in result["cells"])
    )
    result["comparison_without_teacher_s"] = result["comparison_s"] - t["finetune_s"]
    result["summary"] = summarize(result)
    return result


def train_cells(
    cfg: Any, args: argparse.Namespace, teacher: str, start: str, data: Any, run_dir: Path
) -> dict[tuple[int, str], tuple[Any, float]]:
    """Every (seed, mode) cell trained from ``start``, in order; (its phase, its training seconds).
    A cell trained by an earlier run of the command is read back from its marker."""
    from raypost.phases import distill as phases

    trained = {}
    for seed in args.seeds:
        cache: dict = {}  # the teacher's top-k: one pass per seed (its row order), shared by both KD cells
        for mode in args.modes:
            c = cell_config(cfg, mode, seed)
            out = run_dir / f"seed{seed}" / mode
            marker = out.parent / f"{mode}_done.json"
            t1, earlier = time.time(), marker.is_file()
            if not earlier:
                phases.check_placement(c)
            phase = train_cell(c, mode, teacher, start, data, out, cache)
            trained[(seed, mode)] = (phase, _marker_wall(marker) if earlier else time.time() - t1)
            drop_optimizer_states(out)
    return trained


def _marker_wall(marker: Path) -> float:
    return json.loads(marker.read_text()).get("wall_s", 0.0) if marker.is_file() else 0.0


def _brief(ev: dict) -> dict:
    return {"accuracy": ev["accuracy"], "params": ev["params"], "eval_s": ev["eval_s"], "samples": ev["samples"][:3]}


def summarize(result: dict) -> dict:
    """Per mode: mean accuracy, its gain over SFT on each seed, and the share of the teacher's."""
    cells, teacher = result["cells"], result["teacher"]["accuracy"]
    sft = {c["seed"]: c["accuracy"] for c in cells if c["mode"] == "sft"}
    out: dict[str, Any] = {}
    for mode in dict.fromkeys(c["mode"] for c in cells):
        mine = [c for c in cells if c["mode"] == mode]
        mean = statistics.mean(c["accuracy"] for c in mine)
        out[mode] = {
            "accuracy_mean": mean,
            "of_teacher": mean / teacher if teacher else None,
            "gain_over_sft": {c["seed"]: c["accuracy"] - sft[c["seed"]] for c in mine if c["seed"] in sft},
            "step_s": statistics.mean(c["step_s"] for c in mine),
            "train_wall_s": statistics.mean(c["train_wall_s"] for c in mine),
        }
    return out


def print_table(result: dict) -> None:
    rows = []
    for mode, s in result["summary"].items():
        per_seed = [c for c in result["cells"] if c["mode"] == mode]
        teacher_s = [c.get("teacher_s_per_step") for c in per_seed if c.get("teacher_s_per_step") is not None]
        rows.append(
            [
                mode,
                " / ".join(f"{c['accuracy']:.3f}" for c in per_seed),
                f"{s['accuracy_mean']:.3f}",
                " / ".join(f"{g:+.3f}" for g in s["gain_over_sft"].values()),
                f"{s['of_teacher']:.2f}" if s["of_teacher"] is not None else "-",
                f"{s['step_s']:.1f}",
                f"{statistics.mean(teacher_s):.2f}" if teacher_s else "-",
                f"{s['train_wall_s'] / 60:.1f}",
            ]
        )
    t, st = result["teacher"], result["start"]
    print(
        table(
            f"\nDistillation on {result['config']}: teacher {t['accuracy']:.3f} ({t['params'] / 1e6:.0f}M), "
            f"student start {st['accuracy']:.3f} ({st['params'] / 1e6:.0f}M), held-out n={result['heldout_n']}",
            [
                "mode",
                "held-out per seed",
                "mean",
                "vs SFT per seed",
                "of teacher",
                "step s",
                "teacher s/step",
                "train min",
            ],
            rows,
        )
    )
    print(
        f"whole comparison: {result['comparison_s'] / 60:.1f} min: the teacher's fine-tune "
        f"{t['finetune_s'] / 60:.1f} min, then {result['comparison_without_teacher_s'] / 60:.1f} min for both "
        f"evaluations and every cell's training and evaluation"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(ROOT / "examples" / "distill_smollm2.yaml"))
    ap.add_argument("--name", default="distill-compare", help="run folder under run.storage_path (resumes)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    ap.add_argument("--out", default=str(OUT / "distill_smollm2.json"))
    ap.add_argument(
        "--styles",
        action="store_true",
        help="also measure how every model answers (bare '#### n' or "
        "worked lines): one more evaluation each, not timed",
    )
    ap.add_argument("overrides", nargs="*", help="config overrides after --, e.g. -- --train.max_steps 10")
    args = ap.parse_args()
    result = run(args)
    print_table(result)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
