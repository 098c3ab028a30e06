"""SFT rows and packing.

Packing concatenates examples into rows of at most ``max_seq_len`` tokens. Each packed
row carries ``position_ids`` that restart per example and ``segment_ids`` (1, 2, ...) so
the collator can build a block-diagonal causal mask: examples never attend to each
other, and the loss equals the unpacked loss.
"""

from __future__ import annotations

import pandas as pd

from raypost.data.tokenize import sft_example


def _row(ids: list[int], labels: list[int], pos: list[int], seg: list[int], sample_ids: list[str]) -> dict:
    return {
        "input_ids": ids,
        "labels": labels,
        "position_ids": pos,
        "segment_ids": seg,
        "sample_ids": ",".join(sample_ids),
        "num_tokens": len(ids),
    }


def pack_frame(batch: pd.DataFrame, max_seq_len: int, pack: bool) -> pd.DataFrame:
    """Tokenized rows -> SFT rows, greedily packed in order when ``pack`` is true."""
    out: list[dict] = []
    ids: list[int] = []
    labels: list[int] = []
    pos: list[int] = []
    seg: list[int] = []
    sample_ids: list[str] = []
    for rid, p, c in zip(batch["id"], batch["prompt_ids"], batch["completion_ids"]):
        ex = sft_example(list(p), list(c))
        n = len(ex["input_ids"])
        if ids and (not pack or len(ids) + n > max_seq_len):
            out.append(_row(ids, labels, pos, seg, sample_ids))
            ids, labels, pos, seg, sample_ids = [], [], [], [], []
        k = (seg[-1] + 1) if seg else 1
        ids += ex["input_ids"]
        labels += ex["labels"]
        pos += list(range(n))
        seg += [k] * n
        sample_ids.append(str(rid))
    if ids:
        out.append(_row(ids, labels, pos, seg, sample_ids))
    return pd.DataFrame(out)
