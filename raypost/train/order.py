"""What fixes a learner's data order, recorded in its checkpoints and checked when it resumes.

A checkpoint's cursor counts what the run consumed of one deterministic order (global batches,
or prompt rows). A resumed run with another dataset, seed or global batch would read that
cursor against a different order and silently skip or repeat examples. So each checkpoint
records the settings its order depends on, and a resume with any of them changed stops,
naming the fields. Evaluation settings (any key naming ``eval``) and the run's length may change.
"""

from __future__ import annotations

from typing import Any

GLOBAL_BATCH = ("optim.micro_batch_size", "optim.grad_accum", "resources.num_workers")
# By learner phase: prefixes of the dotted config keys its order depends on.
ORDER_KEYS: dict[str, tuple[str, ...]] = {
    "sft": ("data.", "run.seed", "train.epochs", *GLOBAL_BATCH),
    "rm": ("data.", "pairs.", "run.seed", "train.epochs", *GLOBAL_BATCH),
    "dpo": ("data.", "pairs.", "run.seed", "dpo.epochs", *GLOBAL_BATCH),
    "grpo": ("data.", "run.seed", "algo.prompts_per_step", "algo.dynamic_sampling", "algo.max_refill_rounds"),
    "ppo": ("data.", "run.seed", "algo.prompts_per_step", "algo.dynamic_sampling", "algo.max_refill_rounds"),
    "on_policy": ("data.", "run.seed", "distill.prompts_per_step"),
}


def _flat(doc: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in doc.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def order_of(phase: str, config: dict[str, Any]) -> dict[str, Any]:
    """The settings of ``config`` (a pipeline config as JSON) that fix ``phase``'s data order."""
    keys = ORDER_KEYS.get(phase, ())
    return {
        k: v
        for k, v in _flat(config).items()
        if "eval" not in k and any(k == p or (p.endswith(".") and k.startswith(p)) for p in keys)
    }


def check_order(recorded: dict[str, Any], current: dict[str, Any], step: int) -> None:
    """Raise ValueError naming each setting that differs from the checkpoint's (a checkpoint that
    recorded none, from before this check, passes)."""
    if not recorded:
        return
    changed = sorted(k for k in recorded.keys() | current.keys() if recorded.get(k) != current.get(k))
    if changed:
        diffs = "; ".join(f"{k}: {recorded.get(k)!r} in the checkpoint, {current.get(k)!r} now" for k in changed)
        raise ValueError(
            f"this run resumes from its checkpoint at step {step}, whose data order was made with other "
            f"settings ({diffs}). Set them back to resume, or start a new run.name to train with these."
        )
