"""From scored groups to learner tensors, and per-token log-probs under a model.

Sequences are prompt + completion, right-padded. Every per-token tensor is aligned to the
*targets* ``input_ids[:, 1:]``: index t holds the token at position t+1 and is predicted by
the logits at position t.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch


def sequences(groups: Sequence[Any], adv: torch.Tensor) -> list[dict[str, Any]]:
    """One dict per sample: ids, completion start, behaviour logprobs, advantage, version."""
    out = []
    for gi, g in enumerate(groups):
        for si, s in enumerate(g.samples):
            out.append({"ids": g.prompt_ids + s.completion_ids, "start": len(g.prompt_ids),
                        "old": s.logprobs, "adv": float(adv[gi, si]), "train": s.train_mask,
                        "version": s.version, "sample_id": f"{g.row_id}#{si}"})
    return out


def loss_tokens(rows: Sequence[dict[str, Any]]) -> int:
    """Completion tokens that ``collate`` puts in the loss mask of these rows."""
    return sum(len(r["ids"]) - r["start"] for r in rows if r["train"] and len(r["ids"]) > r["start"])


def collate(rows: Sequence[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    """input_ids/attention_mask [N, T]; targets/mask/old_logp [N, T-1]; adv [N]."""
    t = max(len(r["ids"]) for r in rows)
    n = len(rows)
    ids = torch.full((n, t), pad_id, dtype=torch.long)
    attn = torch.zeros((n, t), dtype=torch.long)
    mask = torch.zeros((n, t - 1))
    old = torch.zeros((n, t - 1))
    for i, r in enumerate(rows):
        L, s = len(r["ids"]), r["start"]
        ids[i, :L] = torch.tensor(r["ids"])
        attn[i, :L] = 1
        c = L - s  # completion tokens, targets at indices s-1 .. L-2
        if c > 0 and r["train"]:
            mask[i, s - 1:L - 1] = 1.0
        behaviour = r["old"][:c]  # one log-prob per completion token
        old[i, s - 1:s - 1 + len(behaviour)] = torch.tensor(behaviour, dtype=torch.float32)
    return {"input_ids": ids, "attention_mask": attn, "targets": ids[:, 1:], "mask": mask, "old_logp": old,
            "adv": torch.tensor([r["adv"] for r in rows], dtype=torch.float32)}


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(target) under softmax(logits / temperature), and the per-token entropy.

    logits: [N, T, V] (positions 0..T-1); targets: [N, T-1]. Returns two [N, T-1] tensors.
    """
    logp_all = torch.log_softmax(logits[:, :-1].float() / temperature, dim=-1)
    logp = logp_all.gather(-1, targets[..., None])[..., 0]
    with torch.no_grad():
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy
