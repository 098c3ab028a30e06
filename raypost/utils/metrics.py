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


def read_records(path: str | Path) -> tuple[list[dict[str, Any]], bool]:
    """The rows of an append-only JSONL record (metrics, trained samples) and whether its last line
    was torn: an append cut short by a kill or a full disk leaves a last line that does not parse,
    which is dropped (and logged). A bad line anywhere else is not a torn append: ValueError naming
    the file and line."""
    p = Path(path)
    if not p.is_file():
        return [], False
    lines = [(i, x) for i, x in enumerate(p.read_text().splitlines(), 1) if x.strip()]
    rows = []
    for n, (i, line) in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as err:
            if n == len(lines) - 1:
                logging.getLogger("raypost").warning("%s: dropped a torn last line %d (%s)", p, i, err)
                return rows, True
            raise ValueError(f"{p}:{i} is not JSON ({err}); only a torn last line can be dropped") from None
    return rows, False


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a metrics JSONL; for a step logged twice (a resumed run), the last one wins."""
    by_key: dict[tuple, dict[str, Any]] = {}
    for row in read_records(path)[0]:
        by_key[(row.get("phase", ""), row["step"])] = row
    return sorted(by_key.values(), key=lambda r: r.get("time", 0))
