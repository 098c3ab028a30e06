"""End-of-run report: ``report.json`` and a curve PNG from the metrics JSONL."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from raypost.utils import storage
from raypost.utils.metrics import read_metrics


def plot_curves(metrics_path: str | Path, keys: Sequence[str], out_png: str | Path, title: str) -> Path | None:
    """One panel per key that appears in the metrics, value vs step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics_path)
    present = [k for k in keys if any(k in r for r in rows)]
    if not present:
        return None
    fig, axes = plt.subplots(1, len(present), figsize=(5 * len(present), 3.5), squeeze=False)
    for ax, key in zip(axes[0], present):
        pts = [(r["step"], r[key]) for r in rows if key in r]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="." if len(pts) < 50 else None)
        ax.set_xlabel("step")
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return Path(out_png)


def write_report(run_dir: str | Path, report: dict[str, Any]) -> Path:
    path = Path(run_dir) / "report.json"
    path.write_text(json.dumps(report, indent=2, default=str))
    return path


def finish_run(run_dir: Path, report: dict[str, Any], metrics: str, keys: Sequence[str], png: str, title: str) -> Path:
    """A pipeline's last step: the curves of ``run_dir/metrics`` into ``run_dir/png``, then
    ``report.json``. For a run stored at a URI, what the learners mirrored there is fetched first
    (rank 0 may run on another node) and the whole run folder is mirrored after."""
    storage.pull(run_dir, exports=False)
    plot_curves(run_dir / metrics, keys, run_dir / png, title)
    path = write_report(run_dir, report)
    storage.push(run_dir)
    return path
