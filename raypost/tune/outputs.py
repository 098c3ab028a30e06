"""What a sweep leaves behind: a results table, the best config as a runnable pipeline YAML,
the best checkpoint in HF format, and a metric-vs-iteration plot of every trial."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import yaml

from raypost.tune.space import SpaceFile

HF_DIR = "hf"  # the final checkpoint of a finished trial holds the HF export (train.checkpointing)


def trial_rows(results: Any, space: SpaceFile) -> list[dict[str, Any]]:
    """One row per trial: id, params, last metric, iterations, state.

    state: ``completed`` (ran to its last step: its final checkpoint has the HF export),
    ``stopped early`` (by the scheduler) or ``error``."""
    rows = []
    for r in results:
        metrics = r.metrics or {}
        ckpt = metrics.get("checkpoint_path")
        if r.error is not None:
            state = "error"
        elif ckpt and (Path(ckpt) / HF_DIR).is_dir():
            state = "completed"
        else:
            state = "stopped early"
        rows.append(
            {
                "trial": metrics.get("trial_id", Path(r.path).name),
                "config": {k: r.config.get(k) for k in space.params},
                space.metric: metrics.get(space.metric),
                "iterations": metrics.get("training_iteration", 0),
                "state": state,
                "checkpoint_path": ckpt,
                "metrics_dataframe": r.metrics_dataframe,
            }
        )
    return rows


def best_row(rows: list[dict[str, Any]], space: SpaceFile) -> dict[str, Any]:
    """The best completed trial by its last metric (a trial stopped early has no final export)."""
    done = [r for r in rows if r["state"] == "completed" and r[space.metric] is not None]
    if not done:
        raise RuntimeError("no trial completed; nothing to export (see the table above)")
    return (min if space.mode == "min" else max)(done, key=lambda r: r[space.metric])


def format_table(rows: list[dict[str, Any]], space: SpaceFile) -> str:
    head = f"| trial | config | {space.metric} | iterations | state |\n| --- | --- | ---: | ---: | --- |"
    lines = [head]
    for r in rows:
        conf = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in r["config"].items())
        val = "" if r[space.metric] is None else f"{r[space.metric]:.4f}"
        lines.append(f"| {r['trial']} | {conf} | {val} | {r['iterations']} | {r['state']} |")
    return "\n".join(lines)


def write_best(best: dict[str, Any], sweep_dir: Path, space: SpaceFile) -> dict[str, str]:
    """best_config.yaml (the trial's full pipeline config, as a fresh run named
    ``<sweep>-best``) and best_model/ (the trial's final HF export)."""
    trial_cfg = yaml.safe_load((sweep_dir / "trials" / best["trial"] / "config.yaml").read_text())
    trial_cfg["run"].update(name=f"{sweep_dir.name}-best", storage_path=str(sweep_dir.parent))
    config_path = sweep_dir / "best_config.yaml"
    config_path.write_text(
        f"# best trial {best['trial']} of {sweep_dir.name}: {space.metric} = "
        f"{best[space.metric]:.6g}\n# python pipelines/{space.pipeline}.py --config {config_path}\n"
        + yaml.safe_dump(trial_cfg, sort_keys=False)
    )
    model_dir = sweep_dir / "best_model"
    shutil.rmtree(model_dir, ignore_errors=True)
    shutil.copytree(Path(best["checkpoint_path"]) / HF_DIR, model_dir)
    return {"config": str(config_path), "model": str(model_dir)}


def plot(rows: list[dict[str, Any]], space: SpaceFile, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in rows:
        df = r["metrics_dataframe"]
        if df is None or space.metric not in df:
            continue
        ax.plot(df["training_iteration"], df[space.metric], marker="o", label=f"{r['trial']} ({r['state']})")
    ax.set_xlabel("report (training_iteration)")
    ax.set_ylabel(space.metric)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_outputs(results: Any, space: SpaceFile, sweep_dir: Path) -> dict[str, Any]:
    """Table (printed and in results.json), best config and model, plot."""
    rows = trial_rows(results, space)
    best = best_row(rows, space)
    paths = write_best(best, sweep_dir, space)
    plot(rows, space, sweep_dir / "metric.png")
    out = {
        "metric": space.metric,
        "mode": space.mode,
        "best_trial": best["trial"],
        "best_metric": best[space.metric],
        "best_config": paths["config"],
        "best_model": paths["model"],
        "plot": str(sweep_dir / "metric.png"),
        "trials": [{k: v for k, v in r.items() if k != "metrics_dataframe"} for r in rows],
    }
    (sweep_dir / "results.json").write_text(json.dumps(out, indent=2, default=str))
    out["table"] = format_table(rows, space)
    return out
