"""How much a depth-pruned student loses before any training (issue 23): the held-out CE of the
gold solutions (nats per completion token, teacher-forced) of a model with one contiguous block
of ``--drop`` decoder layers removed, for every block position. The teacher's layers are shared
in memory; nothing is saved.

    .venv/bin/python -m benchmarks.layer_drop --model runs/distill-compare/teacher/<ckpt>/hf --drop 8

Prints a table and writes benchmarks/out/layer_drop.json (``--out``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from benchmarks.common import OUT, ROOT, table


def gold_ce(model, batch: list[tuple[list[int], list[int]]]) -> float:  # type: ignore[no-untyped-def]
    import torch

    total = count = 0.0
    with torch.no_grad():
        for prompt, target in batch:
            logits = model(input_ids=torch.tensor([prompt + target]), use_cache=False).logits[0, len(prompt) - 1 : -1]
            gold = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(target)[:, None])
            total, count = total - gold.sum().item(), count + len(target)
    return total / count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="an HF folder (the fine-tuned teacher)")
    ap.add_argument("--config", default=str(ROOT / "examples" / "distill_smollm2.yaml"), help="its data section")
    ap.add_argument("--drop", type=int, nargs="+", default=[8], help="block sizes to remove")
    ap.add_argument("--rows", type=int, default=48, help="held-out gold solutions")
    ap.add_argument("--out", default=str(OUT / "layer_drop.json"))
    args = ap.parse_args()

    import torch

    from raypost.config import load_config
    from raypost.config.distill import DistillConfig
    from raypost.data import prompt_ids
    from raypost.data.sources import synthetic_rows
    from raypost.data.tokenize import completion_ids
    from raypost.models.hf import load_causal_lm, load_tokenizer

    d = load_config(DistillConfig, ["--config", args.config]).data
    tok, model = load_tokenizer(args.model), load_causal_lm(args.model).eval()
    batch = [
        (prompt_ids(tok, r["question"], d.system_prompt, d.prompt_template), completion_ids(tok, r["answer"]))
        for r in synthetic_rows(d, "eval")[: args.rows]
    ]
    layers = list(model.model.layers)
    result = {
        "model": args.model,
        "rows": args.rows,
        "layers": len(layers),
        "full_ce": gold_ce(model, batch),
        "blocks": [],
    }
    for k in args.drop:
        for first in range(1, len(layers) - k):  # the first and last layers always stay
            t0 = time.time()
            model.model.layers = torch.nn.ModuleList([x for i, x in enumerate(layers) if not first <= i < first + k])
            result["blocks"].append(
                {"drop": k, "first": first, "last": first + k - 1, "ce": gold_ce(model, batch), "s": time.time() - t0}
            )
            print(result["blocks"][-1], flush=True)
    model.model.layers = torch.nn.ModuleList(layers)
    rows = [[b["drop"], f"{b['first']}-{b['last']}", f"{b['ce']:.2f}"] for b in result["blocks"]]
    print(
        table(
            f"\nHeld-out gold CE with a block of layers removed (all {len(layers)}: {result['full_ce']:.3f})",
            ["removed", "layers", "CE nats/token"],
            rows,
        )
    )
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
