"""From scored groups to learner tensors, and per-token log-probs under a model.

Sequences are prompt + completion, right-padded. Every per-token tensor is aligned to the
*targets* ``input_ids[:, 1:]``: index t holds the token at position t+1 and is predicted by
the logits at position t.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import torch

from raypost.rl.records import LearnerBatch, Sequence


def sequences(groups: Iterable[Any], adv: torch.Tensor) -> list[Sequence]:
    """One ``Sequence`` per sample of the scored groups; ``adv``: [groups, G] advantages."""
    out = []
    for gi, g in enumerate(groups):
        for si, s in enumerate(g.samples):
            out.append(
                Sequence(
                    ids=g.prompt_ids + s.completion_ids,
                    start=len(g.prompt_ids),
                    old=s.logprobs,
                    sample_id=f"{g.row_id}#{si}",
                    adv=float(adv[gi, si]),
                    train=s.train_mask,
                    version=s.version,
                    mask=getattr(s, "mask", None),
                    reward=float(s.reward),
                )
            )
    return out


def loss_tokens(rows: Iterable[Sequence]) -> int:
    """Completion tokens that ``collate`` puts in the loss mask of these rows."""
    return sum(r.loss_tokens for r in rows)


def collate(rows: list[Sequence], pad_id: int) -> LearnerBatch:
    """``rows`` as one ``LearnerBatch``: right-padded, the loss mask on each trained completion
    (on its model tokens only, for a multi-turn episode),
    behaviour log-probs under their targets, ``fresh`` 1 where ``stale`` is 0."""
    t = max(len(r.ids) for r in rows)
    n = len(rows)
    ids = torch.full((n, t), pad_id, dtype=torch.long)
    attn = torch.zeros((n, t), dtype=torch.long)
    mask = torch.zeros((n, t - 1))
    old = torch.zeros((n, t - 1))
    for i, r in enumerate(rows):
        L, s = len(r.ids), r.start
        ids[i, :L] = torch.tensor(r.ids)
        attn[i, :L] = 1
        c = L - s  # completion tokens, targets at indices s-1 .. L-2
        if r.loss_tokens:
            mask[i, s - 1 : L - 1] = 1.0 if r.mask is None else torch.tensor(r.mask, dtype=torch.float32)
        behaviour = r.old[:c]  # one log-prob per completion token
        old[i, s - 1 : s - 1 + len(behaviour)] = torch.tensor(behaviour, dtype=torch.float32)
    return LearnerBatch(
        input_ids=ids,
        attention_mask=attn,
        targets=ids[:, 1:],
        mask=mask,
        old_logp=old,
        adv=torch.tensor([r.adv for r in rows], dtype=torch.float32),
        fresh=torch.tensor([float(r.stale == 0) for r in rows]),
        **{field: _per_token(rows, name, t) for name, field in PPO_FIELDS if getattr(rows[0], name) is not None},
    )


# PPO's per-token lists on a ``Sequence`` and the ``LearnerBatch`` fields they fill
PPO_FIELDS = (("token_adv", "token_adv"), ("returns", "returns"), ("values", "old_values"))


def _per_token(rows: list[Sequence], name: str, t: int) -> torch.Tensor:
    """[N, T-1]: each row's [C] list ``name`` under its completion targets, 0 elsewhere."""
    out = torch.zeros((len(rows), t - 1))
    for i, r in enumerate(rows):
        out[i, r.start - 1 : len(r.ids) - 1] = torch.tensor(getattr(r, name), dtype=torch.float32)
    return out


def completion_columns(x: torch.Tensor, rows: list[Sequence]) -> list[list[float]]:
    """The inverse of ``_per_token``: each row's [C] values from an [N, T-1] tensor."""
    return [x[i, r.start - 1 : len(r.ids) - 1].tolist() for i, r in enumerate(rows)]


def trim_to_completions(batch: LearnerBatch) -> tuple[LearnerBatch, int]:
    """``collate``'s batch cut to the positions whose logits the loss reads, as TRL's
    ``logits_to_keep`` does: from the first position that predicts a completion token (the
    shortest prompt's last token) to the end. Returns the batch with every per-token tensor
    ([N, T-1, ...]) sliced to [N, K-1, ...] from that column, and K, the logits positions to keep
    (``model(..., logits_to_keep=K)`` gives [N, K, V]: positions T-K .. T-1). Prompt positions
    then skip the LM head and the log-softmax; with a 49k vocabulary that is most of a prompt
    token's cost."""
    t = batch.input_ids.shape[1]
    used = batch.mask.any(0).nonzero()
    first = int(used[0]) if len(used) else 0
    cut = {k: getattr(batch, k)[:, first:] for k in batch.per_token if getattr(batch, k) is not None}
    return dataclasses.replace(batch, **cut), t - first


def token_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, chunk_tokens: int = 1024
) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(target) under softmax(logits / temperature), and the per-token entropy.

    logits: [N, T, V] (positions 0..T-1); targets: [N, T-1]. Returns two [N, T-1] fp32 tensors
    (log-probs with grad, entropy without).

    Selective and chunked, as in torchtune and prime-rl: log p = x_target - logsumexp(x), taken
    over ``chunk_tokens`` positions at a time by ``_SelectiveLogprob``, whose backward writes
    the logits' gradient chunk by chunk into one tensor. So besides the logits and their
    gradient no [N, T, V] tensor exists (with a 49k vocabulary a full fp32 log-softmax is 0.4 GB
    per 2k tokens, and autograd keeps it; its exp for the entropy is another)."""
    return _SelectiveLogprob.apply(logits, targets, float(temperature), int(chunk_tokens))


def _chunks(n: int, t: int, size: int):
    for i in range(n):
        for a in range(0, t, size):
            yield i, a, min(t, a + size)


class _SelectiveLogprob(torch.autograd.Function):
    """Forward: per chunk x = logits / temperature, logp = x[target] - lse(x), entropy.
    Backward: d logp / d logits = (onehot(target) - softmax(x)) / temperature, per chunk."""

    @staticmethod
    def forward(
        ctx, logits: torch.Tensor, targets: torch.Tensor, temperature: float, chunk: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n, t = targets.shape
        logp = torch.zeros((n, t), dtype=torch.float32, device=logits.device)
        entropy, lse = torch.zeros_like(logp), torch.zeros_like(logp)
        for i, a, b in _chunks(n, t, chunk):
            x = logits[i, a:b].float() / temperature
            lse[i, a:b] = torch.logsumexp(x, dim=-1)
            logp[i, a:b] = x.gather(-1, targets[i, a:b, None])[:, 0] - lse[i, a:b]
            entropy[i, a:b] = lse[i, a:b] - (torch.softmax(x, dim=-1) * x).sum(-1)
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature, ctx.chunk = temperature, chunk
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp: torch.Tensor, _grad_entropy: torch.Tensor | None):
        logits, targets, lse = ctx.saved_tensors
        grad = torch.zeros_like(logits)  # the last position predicts nothing: its gradient stays 0
        n, t = targets.shape
        for i, a, b in _chunks(n, t, ctx.chunk):
            g = grad_logp[i, a:b].float()
            x = logits[i, a:b].float() / ctx.temperature
            chunk = torch.exp(x - lse[i, a:b, None]).mul_(-g[:, None])  # -softmax(x) * g
            chunk.scatter_add_(-1, targets[i, a:b, None], g[:, None])  # + onehot(target) * g
            grad[i, a:b] = (chunk / ctx.temperature).to(grad.dtype)
        return grad, None, None, None
