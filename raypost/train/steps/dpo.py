"""The DPO step (and IPO, SimPO through the registered preference loss): the summed completion
log-probs of each pair's chosen and rejected sequences under the policy and, unless the loss is
reference-free, the frozen reference; the loss normalized over the pairs of the whole global
batch. A micro-batch's 2B sequences go through the model in one forward pass, as a
``LearnerBatch`` trimmed to the completion positions (no LM head over the prompts). With
``dpo.reference: precomputed`` the reference's log-probs come with the rows (``train.reference``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from raypost.algos import PREFERENCE_LOSSES
from raypost.algos.preference import NEEDS_REFERENCE, PairLogps, PreferenceParams
from raypost.config.dpo import DPOConfig
from raypost.rl.records import Sequence
from raypost.rl.tensors import collate, token_logprobs, trim_to_completions
from raypost.train.batches import micro_batches
from raypost.train.collectives import all_sum
from raypost.train.reference import stored
from raypost.train.steps import accumulate, mean_metrics


def pair_sequences(rows: list[dict[str, Any]]) -> list[Sequence]:
    """The B chosen sequences (prompt + chosen response), then the B rejected ones."""
    out = []
    for side in ("chosen", "rejected"):
        for r in rows:
            prompt, response = (
                [int(t) for t in np.asarray(r["prompt_ids"])],
                [int(t) for t in np.asarray(r[f"{side}_ids"])],
            )
            out.append(Sequence(ids=prompt + response, start=len(prompt), old=[], sample_id=f"{r['id']}:{side}"))
    return out


def pair_logps(model: Any, rows: list[dict[str, Any]], pad_id: int, device: Any) -> PairLogps:
    """Summed completion log-probs of ``rows``' pairs under ``model`` (a DeepSpeed engine or a
    frozen module), with their completion lengths."""
    seqs = pair_sequences(rows)
    b, keep = trim_to_completions(collate(seqs, pad_id).to(device))
    logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask, use_cache=False, logits_to_keep=keep).logits
    logp, _ = token_logprobs(logits, b.targets, 1.0)
    sums = (logp * b.mask).sum(-1)
    lens = torch.tensor([float(s.completion_len) for s in seqs], device=sums.device)
    n = len(rows)
    return PairLogps(sums[:n], sums[n:], lens[:n], lens[n:])


def params_of(cfg: DPOConfig) -> PreferenceParams:
    d = cfg.dpo
    return PreferenceParams(
        beta=d.beta, label_smoothing=d.label_smoothing, simpo_gamma=d.simpo_gamma, nll_weight=d.nll_weight
    )


def loss_on(
    engine: Any, ref: Any, rows: list[dict[str, Any]], cfg: DPOConfig, pad_id: int, norm: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """One micro-batch's share of the loss over ``norm`` pairs, and its metrics."""
    policy = pair_logps(engine, rows, pad_id, engine.device)
    return PREFERENCE_LOSSES.get_fn(cfg.dpo.loss)(
        policy, reference_of(ref, rows, cfg, pad_id, engine.device), params_of(cfg), norm
    )


def reference_of(ref: Any, rows: list[dict[str, Any]], cfg: DPOConfig, pad_id: int, device: Any) -> PairLogps | None:
    """The reference's log-probs of ``rows``: None for a reference-free loss, the precomputed
    columns (``dpo.reference: precomputed``), else a forward pass of the frozen ``ref``."""
    if not NEEDS_REFERENCE[cfg.dpo.loss]:
        return None
    if cfg.dpo.reference == "precomputed":
        return stored(rows, device)
    with torch.no_grad():
        return pair_logps(ref, rows, pad_id, device)


def learn(engine: Any, ref: Any, rows: list[dict[str, Any]], cfg: DPOConfig, pad_id: int) -> dict[str, float]:
    """One optimizer step over this rank's pairs of the global batch (``ref``: the frozen
    reference, None for a reference-free loss). Returns the metrics as means over the global batch."""
    (norm,) = all_sum(float(len(rows)))
    chunks = list(micro_batches(rows, cfg.optim.micro_batch_size))
    _, per_chunk = accumulate(engine, chunks, lambda mb: loss_on(engine, ref, mb, cfg, pad_id, norm))
    local = mean_metrics(per_chunk, [len(mb) for mb in chunks])
    keys = sorted(local)
    *sums, total = all_sum(*(local[k] * len(rows) for k in keys), float(len(rows)))
    return {k: v / max(total, 1.0) for k, v in zip(keys, sums)}
