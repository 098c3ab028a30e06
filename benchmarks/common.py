"""Shared helpers for benchmarks: models, prompts, child-process variants, tables."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = Path(__file__).parent / "out"

# W1: the tiny offline model; W2: ~100M Qwen2 shape (hidden 768, 12 layers), random init.
SHAPES = {
    "tiny": {},
    "100m": {
        "hidden_size": 768,
        "num_layers": 12,
        "num_heads": 12,
        "num_kv_heads": 4,
        "intermediate_size": 2048,
        "vocab_size": 1024,
    },
}


def model_for(shape: str) -> Path:
    from raypost.config import TinyModelConfig
    from raypost.data import synthetic
    from raypost.models.tiny import build_tiny_model

    rows = synthetic.generate(2000, 1234)
    texts = [r["question"] for r in rows] + [r["answer"] for r in rows]
    return build_tiny_model(TinyModelConfig(**SHAPES[shape]), texts, OUT / f"model_{shape}")


def prompts_for(model_path: Path, k: int) -> list[list[int]]:
    from raypost.data import prompt_ids, synthetic
    from raypost.models.hf import load_tokenizer

    tok = load_tokenizer(model_path)
    return [prompt_ids(tok, r["question"], None) for r in synthetic.generate(k, seed=99)]


def flags(values: Mapping[str, Any]) -> list[str]:
    """{"run.name": "x", "algo.steps": 4} -> ["--run.name", "x", "--algo.steps", "4"] (a pipeline's overrides)."""
    return [x for k, v in values.items() for x in (f"--{k}", str(v))]


def run_child(
    script: Path,
    args: list[str],
    env: dict[str, str] | None = None,
    timeout: float = 1800,
    base_env: Mapping[str, str] | None = None,
    mark: str | None = None,
) -> dict[str, Any]:
    """Run ``script ARGS`` (as its module, ``python -m benchmarks.x``) and parse the JSON it
    prints: on its last stdout line, or after ``mark``
    on the line that starts with it (for children whose libraries log to stdout too, as vLLM).
    The child's environment is ``base_env`` (default: this process's) updated with ``env``."""
    proc = subprocess.run(
        [sys.executable, "-m", script.resolve().relative_to(ROOT).with_suffix("").as_posix().replace("/", "."), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**(os.environ if base_env is None else base_env), **(env or {})},
        timeout=timeout,
    )
    lines = proc.stdout.strip().splitlines()
    if mark is None:
        line = lines[-1] if lines else None
    else:
        line = next((x[len(mark) :] for x in lines if x.startswith(mark)), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"{script.name} {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(line)


def run_grpo(config: str, name: str, root: Path, args: list[str]) -> tuple[dict[str, Any], list[dict], float]:
    """``raypost grpo --config config ARGS`` in a child process (its own local Ray cluster, wandb
    off), as run ``name`` under ``root``: its report, its GRPO steps' metric rows, the wall seconds."""
    cmd = [sys.executable, "-m", "raypost.cli", "grpo", "--config", config, *args]
    cmd += ["--run.name", name, "--run.storage_path", str(root), "--run.wandb_mode", "disabled"]
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-4000:]}")
    report = json.loads((root / name / "report.json").read_text())
    rows = [json.loads(x) for x in (root / name / "metrics.jsonl").read_text().splitlines()]
    return report, [r for r in rows if r.get("phase") == "grpo"], time.time() - t0


# TRL trainers' arguments in every side-by-side: CPU, fp32, no logging services, no checkpoints,
# every step logged, data loaded in the training process
TRL_ON_CPU: dict[str, Any] = {
    "use_cpu": True,
    "bf16": False,
    "report_to": "none",
    "logging_steps": 1,
    "save_strategy": "no",
    "disable_tqdm": True,
    "seed": 0,
    "dataloader_num_workers": 0,
    "dataloader_pin_memory": False,
}


def step_timer(times: list[float]) -> Any:
    """A transformers ``TrainerCallback`` that appends each optimizer step's wall seconds to ``times``."""
    import time

    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.t0)

    return StepTimer()


def table(title: str, header: list[str], rows: list[list[Any]]) -> str:
    widths = [max(len(str(h)), *(len(f"{r[i]}") for r in rows)) for i, h in enumerate(header)]
    line = lambda cells: "  ".join(f"{c!s:>{w}}" if i else f"{c!s:<{w}}" for i, (c, w) in enumerate(zip(cells, widths)))  # noqa: E731
    return "\n".join([title, line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)])
