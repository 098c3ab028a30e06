"""The frozen reference's log-probs computed once, by a Ray Data pass over the tokenized pairs
(``dpo.reference: precomputed``, TRL's ``precompute_ref_log_probs``): the learner then holds no
reference model and runs no reference forward pass. The values are the ones the learner's own
reference would give (``train.steps.dpo.pair_logps``, same model, precision and sums)."""

from __future__ import annotations

from typing import Any

import pandas as pd
import torch

from raypost.algos.preference import PairLogps

REF_COLUMNS = ("ref_chosen", "ref_rejected")


class ReferenceLogps:
    """Ray Data UDF: adds ``ref_chosen`` and ``ref_rejected``, the summed completion log-probs of
    each pair under the model at ``model_path``, scored ``micro_batch`` pairs at a time."""

    def __init__(self, model_path: str, precision: str, micro_batch: int) -> None:
        from raypost.models.hf import load_causal_lm, load_tokenizer

        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model = load_causal_lm(model_path, precision).to(self.device).eval()
        self.pad_id, self.micro_batch = load_tokenizer(model_path).pad_token_id, micro_batch

    def __call__(self, batch: pd.DataFrame) -> pd.DataFrame:
        from raypost.train.steps.dpo import pair_logps

        rows = batch.to_dict(orient="records")
        chosen: list[float] = []
        rejected: list[float] = []
        with torch.no_grad():
            for i in range(0, len(rows), self.micro_batch):
                out = pair_logps(self.model, rows[i : i + self.micro_batch], self.pad_id, self.device)
                chosen += out.chosen.float().cpu().tolist()
                rejected += out.rejected.float().cpu().tolist()
        return batch.assign(ref_chosen=chosen, ref_rejected=rejected)


def stored(rows: list[dict[str, Any]], device: Any) -> PairLogps:
    """The precomputed reference of ``rows`` (each with ``ref_chosen``, ``ref_rejected``)."""
    c = torch.tensor([float(r["ref_chosen"]) for r in rows], device=device)
    r = torch.tensor([float(r["ref_rejected"]) for r in rows], device=device)
    lens = [(float(len(x["chosen_ids"])), float(len(x["rejected_ids"]))) for x in rows]
    return PairLogps(
        c, r, torch.tensor([a for a, _ in lens], device=device), torch.tensor([b for _, b in lens], device=device)
    )
