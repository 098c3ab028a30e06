"""What GRPO changed in the embedded default's policy: guessing vs working the problem.

The default task's SFT demos are half guesses (``#### <first number>``, README "The embedded
default"). For each model given, this decodes the held-out problems with transformers, greedily
and by sampling (T = 1, ``--samples`` per problem), and splits the answers into bare guesses and
worked solutions:

    .venv/bin/python -m benchmarks.grpo_guess_share --model warm-up=runs/grpo/warmup/<ckpt>/hf \\
        --model grpo=runs/grpo/grpo/<ckpt>/hf

Prints a table and writes benchmarks/out/grpo_guess_share.json.
"""

from __future__ import annotations

import argparse
import json

from benchmarks.common import OUT, table


def decode(model, tok, ids: list[int], samples: int) -> tuple[str, list[str]]:
    """The greedy completion and ``samples`` sampled ones (T = 1, no top-k/top-p) of one prompt."""
    import torch

    x = torch.tensor([ids])
    with torch.no_grad():
        greedy = model.generate(x, max_new_tokens=48, do_sample=False, pad_token_id=tok.pad_token_id)
        sampled = model.generate(
            x,
            max_new_tokens=48,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            num_return_sequences=samples,
            pad_token_id=tok.pad_token_id,
        )
    text = lambda out: tok.decode(out[len(ids) :], skip_special_tokens=True).strip()  # noqa: E731
    return text(greedy[0]), [text(o) for o in sampled]


def shares(completions: list[tuple[str, str]]) -> dict[str, float]:
    """(completion, gold) pairs -> share that are bare guesses, accuracy, accuracy of the worked ones."""
    from raypost.rewards.verifiers import answers_match

    bare = [c.startswith("####") for c, _ in completions]
    right = [answers_match(c, g) for c, g in completions]
    worked_right = [r for r, b in zip(right, bare) if not b]
    return {
        "guess_share": sum(bare) / len(bare),
        "accuracy": sum(right) / len(right),
        "worked_accuracy": sum(worked_right) / max(1, len(worked_right)),
    }


def measure(path: str, n: int, samples: int) -> dict[str, dict[str, float]]:
    import torch

    from raypost.config.grpo import GRPOConfig
    from raypost.data import prompt_ids
    from raypost.data.answers import final_answer
    from raypost.data.sources import synthetic_rows
    from raypost.models.hf import load_causal_lm, load_tokenizer

    torch.manual_seed(0)
    tok, model = load_tokenizer(path), load_causal_lm(path).eval()
    greedy, sampled = [], []
    for row in synthetic_rows(GRPOConfig().data, "eval")[:n]:
        gold = final_answer(row["answer"])
        g, s = decode(model, tok, prompt_ids(tok, row["question"], None), samples)
        greedy.append((g, gold))
        sampled += [(c, gold) for c in s]
    return {"greedy": shares(greedy), "sampled": shares(sampled)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", required=True, help="NAME=PATH of an HF model folder (repeatable)")
    ap.add_argument("--problems", type=int, default=200, help="held-out problems decoded")
    ap.add_argument("--samples", type=int, default=4, help="sampled completions per problem")
    args = ap.parse_args()
    results = {}
    for spec in args.model:
        name, sep, path = spec.partition("=")
        if not sep:
            ap.error(f"--model takes NAME=PATH, got '{spec}'")
        results[name] = measure(path, args.problems, args.samples)
    rows = [
        [name, mode, *(f"{r[mode][k]:.3f}" for k in ("guess_share", "accuracy", "worked_accuracy"))]
        for name, r in results.items()
        for mode in ("greedy", "sampled")
    ]
    print(
        table(
            f"\nGuessing vs working, {args.problems} held-out problems ({args.samples} samples each at T = 1)",
            ["model", "decoding", "guess share", "accuracy", "accuracy of worked answers"],
            rows,
        )
    )
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "grpo_guess_share.json").write_text(json.dumps({"config": vars(args), "results": results}, indent=2))


if __name__ == "__main__":
    main()
