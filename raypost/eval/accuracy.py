"""Held-out greedy exact-match accuracy: transformers ``generate`` in a Ray task, or a vLLM
replica (a rollout app deployed for the evaluation, or the run's own)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import ray
import torch

from raypost.rewards.verifiers import answers_match

if TYPE_CHECKING:
    from raypost.config import EvalConfig
    from raypost.config.serve import RolloutConfig


def greedy_completions(
    model: Any, prompts: Sequence[Sequence[int]], pad_id: int, eos_id: int, max_new_tokens: int, batch_size: int
) -> list[list[int]]:
    """Greedy continuations of token-id prompts (left-padded batches), up to EOS."""
    out: list[list[int]] = []
    model.eval()
    for i in range(0, len(prompts), batch_size):
        chunk = [list(p) for p in prompts[i : i + batch_size]]
        t = max(len(p) for p in chunk)
        ids = torch.tensor([[pad_id] * (t - len(p)) + p for p in chunk])
        mask = torch.tensor([[0] * (t - len(p)) + [1] * len(p) for p in chunk])
        with torch.no_grad():
            gen = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=pad_id,
                eos_token_id=eos_id,
            )
        for row in gen[:, t:].tolist():
            out.append(row[: row.index(eos_id) + 1] if eos_id in row else row)
    return out


def accuracy(
    model_path: str,
    rows: Sequence[dict[str, Any]],
    max_new_tokens: int,
    batch_size: int,
    keep_samples: int = 5,
    extract: str = "strict",
) -> dict[str, Any]:
    """Exact-match accuracy of greedy answers on ``rows`` (each: prompt_ids, answer)."""
    from raypost.models.hf import load_causal_lm, load_tokenizer

    torch.set_num_threads(os.cpu_count() or 1)
    tok = load_tokenizer(model_path)
    model = load_causal_lm(model_path)
    comps = greedy_completions(
        model, [r["prompt_ids"] for r in rows], tok.pad_token_id, tok.eos_token_id, max_new_tokens, batch_size
    )
    texts = tok.batch_decode(comps, skip_special_tokens=True)
    verdicts = [answers_match(t, r["answer"], extract) for t, r in zip(texts, rows)]
    hits = [bool(v) for v in verdicts]  # no verdict (a timed-out symbolic check): not counted correct
    samples = [
        {"answer": r["answer"], "completion": t, "correct": h}
        for r, t, h in list(zip(rows, texts, hits))[:keep_samples]
    ]
    return {
        "accuracy": sum(hits) / max(1, len(hits)),
        "n": len(hits),
        "unverified": verdicts.count(None),
        "samples": samples,
    }


def remote_accuracy(
    model_path: str,
    rows: Sequence[dict[str, Any]],
    max_new_tokens: int,
    batch_size: int,
    num_cpus: float = 1.0,
    extract: str = "strict",
    keep_samples: int = 5,
) -> dict[str, Any]:
    """``accuracy`` as a Ray task, so the driver stays thin and the cluster places it."""
    task = ray.remote(num_cpus=num_cpus)(accuracy)
    return ray.get(task.remote(model_path, list(rows), max_new_tokens, batch_size, keep_samples, extract=extract))


def rollout_accuracy(
    client: Any, rows: Sequence[dict[str, Any]], max_new_tokens: int, keep_samples: int = 5, extract: str = "strict"
) -> dict[str, Any]:
    """Greedy exact-match accuracy through the rollout replicas (vLLM), at their current weights."""
    outs = client.generate([r["prompt_ids"] for r in rows], 1, {"temperature": 0.0, "max_tokens": max_new_tokens})
    texts = [o["completions"][0]["text"] for o in outs]
    verdicts = [answers_match(t, r["answer"], extract) for t, r in zip(texts, rows)]
    hits = [bool(v) for v in verdicts]
    return {
        "accuracy": sum(hits) / max(1, len(hits)),
        "n": len(hits),
        "unverified": verdicts.count(None),
        "weight_version": outs[0]["version"],
        "samples": [
            {"answer": r["answer"], "completion": t, "correct": h}
            for r, t, h in list(zip(rows, texts, hits))[:keep_samples]
        ],
    }


def heldout_accuracy(
    model_path: str,
    rows: Sequence[dict[str, Any]],
    ev: EvalConfig,
    rollout: RolloutConfig | None = None,
    keep_samples: int = 5,
) -> dict[str, Any]:
    """Greedy accuracy of ``model_path`` as ``ev`` says: ``engine: vllm`` deploys it as a rollout
    app (``rollout``; None: RolloutConfig's defaults) for the evaluation, ``transformers`` runs
    ``accuracy`` as a Ray task."""
    if ev.engine == "vllm":
        from raypost.config.serve import RolloutConfig
        from raypost.serve.apps import served

        with served(model_path, rollout or RolloutConfig(), "eval", chunk=ev.batch_size) as client:
            return rollout_accuracy(client, rows, ev.max_new_tokens, keep_samples, extract=ev.extract)
    return remote_accuracy(
        model_path, rows, ev.max_new_tokens, ev.batch_size, extract=ev.extract, keep_samples=keep_samples
    )
