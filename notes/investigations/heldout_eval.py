"""Greedy held-out accuracy of a model through vLLM (offline engine, large batches): the
embedded task's 200 held-out problems (as ``pipelines/grpo.py`` builds them) and the first N
GSM8K test problems, with strict ('#### n') and flexible answer extraction, plus the share of
answers cut at the token budget. For the SmolLM2 figures of issue 20: the instruct checkpoint
(before) and a trained run's model (after).

  .venv/bin/python -m notes.investigations.heldout_eval                                    # smollm2-135m-instruct
  .venv/bin/python -m notes.investigations.heldout_eval --model runs/grpo-smollm2/grpo/<checkpoint>/hf --tag after
  .venv/bin/python -m notes.investigations.heldout_eval --template "{question}\\nAnswer on a line '#### <number>'."
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from pathlib import Path

from benchmarks.common import OUT, table

GSM8K_TEST = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k" / "test.jsonl"


def problem_sets(max_operand: int, gsm8k: int, num_train: int | None = None) -> dict[str, list[dict]]:
    from raypost.config import DataConfig
    from raypost.data.sources import synthetic_rows

    task = {"num_eval": 200, "max_operand": max_operand, **({"num_train": num_train} if num_train else {})}
    data = DataConfig.model_validate({"synthetic": task})  # held-out = never a train question of the run's task
    sets = {"synthetic": synthetic_rows(data, "eval")}
    if gsm8k and GSM8K_TEST.is_file():
        sets["gsm8k"] = [json.loads(x) for x in GSM8K_TEST.read_text().splitlines()[:gsm8k]]
    return sets


GUESS = re.compile(r"^####\s*-?[\d.,/]+$")  # the weak teacher's demo: a bare '#### <number>', no working


def evaluate(llm, tok, rows: list[dict], template: str, max_tokens: int, system: str | None = None) -> dict:
    from vllm import SamplingParams

    from raypost.data.tokenize import prompt_ids
    from raypost.rewards.verifiers import answers_match

    prompts = [{"prompt_token_ids": prompt_ids(tok, r["question"], system, template)} for r in rows]
    t0 = time.time()
    outs = [
        o.outputs[0]
        for o in llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens), use_tqdm=False)
    ]
    secs = time.time() - t0
    res = {
        "n": len(rows),
        "seconds": round(secs, 1),
        "tokens_per_s": round(sum(len(o.token_ids) for o in outs) / secs, 1),
        "mean_tokens": round(sum(len(o.token_ids) for o in outs) / len(outs), 1),
        "truncated": round(sum(o.finish_reason == "length" for o in outs) / len(outs), 3),
        "guess_share": round(sum(bool(GUESS.match(o.text.strip())) for o in outs) / len(outs), 3),
    }
    for how in ("strict", "flexible"):
        res[how] = round(sum(answers_match(o.text, r["answer"], how) for o, r in zip(outs, rows)) / len(rows), 3)
    res["samples"] = [
        {"question": r["question"], "answer": r["answer"].split("####")[-1].strip(), "completion": o.text}
        for o, r in list(zip(outs, rows))[:3]
    ]
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--tag", default="instruct", help="name of this model in the JSON (before, after, ...)")
    ap.add_argument("--template", default="{question}", help="data.prompt_template of the run")
    ap.add_argument("--max-operand", type=int, default=10, help="data.synthetic.max_operand of the run")
    ap.add_argument(
        "--num-train",
        type=int,
        default=None,
        help="data.synthetic.num_train of the run (its held-out problems exclude its train questions)",
    )
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--gsm8k", type=int, default=100, help="GSM8K test problems (0: none)")
    ap.add_argument("--system", default=None, help="data.system_prompt of the run (default: the template's own)")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from vllm import LLM

    from raypost.models.hf import load_tokenizer
    from raypost.models.named import resolve

    path = resolve(args.model)
    llm = LLM(model=path, dtype="float32", max_model_len=1024, enforce_eager=True, kv_cache_memory_bytes=2**30, seed=0)
    tok = load_tokenizer(path)
    results = {
        name: evaluate(llm, tok, rows, args.template, args.max_tokens, args.system)
        for name, rows in problem_sets(args.max_operand, args.gsm8k, args.num_train).items()
    }
    print(
        table(
            f"greedy held-out accuracy, {args.model} ({args.tag}), {args.max_tokens} new tokens",
            ["set", "n", "strict", "flexible", "truncated", "bare guesses", "mean tokens", "tokens/s"],
            [
                [
                    k,
                    r["n"],
                    r["strict"],
                    r["flexible"],
                    r["truncated"],
                    r["guess_share"],
                    r["mean_tokens"],
                    r["tokens_per_s"],
                ]
                for k, r in results.items()
            ],
        )
    )
    OUT.mkdir(exist_ok=True)
    out = OUT / f"heldout_eval_{args.tag}.json"
    out.write_text(
        json.dumps(
            {
                "model": args.model,
                "tag": args.tag,
                "template": args.template,
                "system": args.system,
                "max_tokens": args.max_tokens,
                "max_operand": args.max_operand,
                "results": results,
            },
            indent=1,
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
