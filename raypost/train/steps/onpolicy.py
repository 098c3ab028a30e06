"""The on-policy distillation step: the student's log-probs of its own sampled tokens against
the teacher's scores of those tokens. Both losses are token means over the sampled tokens of
the whole global batch (counted over all ranks):

  reverse_kl  the per-token reverse KL as a dense advantage (``algos.distill.on_policy_reverse_kl``);
  gkd         the divergence ``distill.divergence`` on the teacher's top-k at every sampled
              position (``algos.distill.kd_loss``; GKD with only on-policy data).
"""

from __future__ import annotations

from typing import Any

import torch

from raypost.algos.distill import KDParams, kd_loss, on_policy_reverse_kl
from raypost.config.distill import DistillConfig
from raypost.rl.records import LearnerBatch, Sequence
from raypost.rl.tensors import collate, loss_tokens, token_logprobs, trim_to_completions
from raypost.train.batches import micro_batches
from raypost.train.collectives import all_sum
from raypost.train.steps import accumulate, mean_metrics


def teacher_tensors(rows: list[Sequence], t: int, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Teacher log-probs of the sampled tokens [N, T-1], and its top-k ids/log-probs [N, T-1, k],
    aligned with ``rl.tensors.collate``'s targets."""
    n, width = len(rows), max(k, 1)
    lp, top = torch.zeros(n, t - 1), torch.zeros(n, t - 1, width)
    ids = torch.zeros(n, t - 1, width, dtype=torch.long)
    for i, r in enumerate(rows):
        s, c = r.start, len(r.teacher)
        lp[i, s - 1 : s - 1 + c] = torch.tensor(r.teacher, dtype=torch.float32)
        if k:
            ids[i, s - 1 : s - 1 + c] = torch.tensor(r.top_ids, dtype=torch.long).reshape(c, k)
            top[i, s - 1 : s - 1 + c] = torch.tensor(r.top_logprobs, dtype=torch.float32).reshape(c, k)
    return lp, ids, top


def _gkd(
    logits: torch.Tensor, logp: torch.Tensor, b: LearnerBatch, kd: KDParams, norm: float
) -> tuple[torch.Tensor, dict[str, float]]:
    keep = b.mask > 0
    weights = torch.ones(int(keep.sum()), device=logits.device)
    total, _, m = kd_loss(logits[:, :-1][keep], b.top_ids[keep], b.top_lp[keep], weights, kd)
    with torch.no_grad():  # the same diagnostics as the reverse-KL loss reports
        tokens = b.mask.sum().clamp(min=1)
        m["reverse_kl"] = float(((b.old_logp - b.teacher_lp) * b.mask).sum() / tokens)
        m["ratio_mean"] = float(((logp - b.old_logp).exp() * b.mask).sum() / tokens)
    return total / max(norm, 1.0), m


def learn(engine: Any, rows: list[Sequence], cfg: DistillConfig, pad_id: int) -> dict[str, float]:
    """One optimizer step over this rank's sequences of the global batch. Returns the global
    batch's loss and the other metrics averaged over micro-batches."""
    d = cfg.distill
    k = d.top_k if d.on_policy_loss == "gkd" else 0
    kd = KDParams(divergence=d.divergence, beta=d.beta, temperature=d.temperature)
    (norm,) = all_sum(float(loss_tokens(rows)))

    def loss_of(mb: list[Sequence]) -> tuple[torch.Tensor, dict[str, float]]:
        b = collate(mb, pad_id)
        b.teacher_lp, b.top_ids, b.top_lp = teacher_tensors(mb, b.input_ids.shape[1], k)
        b, positions = trim_to_completions(b.to(engine.device))
        logits = engine(
            input_ids=b.input_ids, attention_mask=b.attention_mask, use_cache=False, logits_to_keep=positions
        ).logits
        # log-probs at the sampling temperature, as the replica's behaviour log-probs are
        logp, _ = token_logprobs(logits, b.targets, d.on_policy_temperature)
        if d.on_policy_loss == "gkd":
            return _gkd(logits, logp, b, kd, norm)
        return on_policy_reverse_kl(logp, b.old_logp, b.teacher_lp, b.mask, norm)

    share, per_chunk = accumulate(engine, list(micro_batches(rows, d.on_policy_optim.micro_batch_size)), loss_of)
    metrics = mean_metrics(per_chunk)
    (metrics["loss"],) = all_sum(share)
    return metrics
