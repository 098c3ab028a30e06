"""Metrics: a local JSONL, wandb (offline by default), and progress lines with rate and ETA."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("raypost")


def _fmt_duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


class MetricsLogger:
    """Writes one JSON line per logged step; mirrors to wandb when enabled. Only the writer
    (rank 0) touches files; other ranks may hold an inactive logger."""

    def __init__(
        self,
        run_dir: str | Path,
        active: bool,
        wandb_mode: str = "offline",
        project: str = "raypost",
        run_name: str = "run",
        config: dict[str, Any] | None = None,
    ) -> None:
        self.active = active
        self.path = Path(run_dir) / "metrics.jsonl"
        self._wandb = None
        if not active:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if wandb_mode != "disabled":
            try:
                import wandb

                self._wandb = wandb.init(
                    project=project,
                    name=run_name,
                    mode=wandb_mode,
                    dir=str(run_dir),
                    config=config or {},
                    reinit="finish_previous",
                )
            except Exception as err:  # wandb is a mirror; the JSONL is the record
                log.warning("wandb disabled (%s); metrics still go to %s", err, self.path)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        if not self.active:
            return
        row = {"step": step, "time": time.time(), **metrics}
        with self.path.open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        if self._wandb is not None:
            self._wandb.log(metrics, step=step)

    def finish(self) -> None:
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


class Progress:
    """Periodic progress lines: step/total, chosen metrics, tokens/s and ETA."""

    def __init__(self, total: int, start_step: int = 0, name: str = "train") -> None:
        self.total, self.start_step, self.name = total, start_step, name
        self.t0 = time.time()

    def line(self, step: int, metrics: dict[str, Any]) -> str:
        done = max(1, step - self.start_step)
        elapsed = time.time() - self.t0
        eta = elapsed / done * max(0, self.total - step)
        parts = [f"{self.name} step {step}/{self.total}"]
        for k, v in metrics.items():
            parts.append(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}")
        parts.append(f"elapsed {_fmt_duration(elapsed)} eta {_fmt_duration(eta)}")
        return " | ".join(parts)


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a metrics JSONL; for a step logged twice (a resumed run), the last one wins."""
    p = Path(path)
    if not p.is_file():
        return []
    by_key: dict[tuple, dict[str, Any]] = {}
    for line in p.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            by_key[(row.get("phase", ""), row["step"])] = row
    return sorted(by_key.values(), key=lambda r: r.get("time", 0))
