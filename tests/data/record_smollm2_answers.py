"""Record real SmolLM2-135M-Instruct answers for tests/unit/rewards/test_answers_real.py (run once, by hand):

  .venv/bin/python tests/data/record_smollm2_answers.py

Greedy answers (vLLM, fp32) to synthetic problems and GSM8K test problems, with the plain
question and with a prompt that asks for a '#### n' line. The file keeps the question, the gold
answer and the completion; the test labels what a reader takes as each final answer.
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

TEMPLATES = {
    "plain": "{question}",
    "format": "{question}\nSolve it briefly, then write the final answer on its own line as '#### <number>'.",
}


def main() -> None:
    from vllm import LLM, SamplingParams

    from raypost.data import synthetic
    from raypost.data.answers import final_answer
    from raypost.data.tokenize import prompt_ids
    from raypost.models.hf import load_tokenizer
    from raypost.models.named import resolve

    path = resolve("smollm2-135m-instruct")
    tok = load_tokenizer(path)
    rows = [
        {"source": "synthetic", "question": r["question"], "gold": final_answer(r["answer"])}
        for r in synthetic.generate(8, seed=2024)
    ]
    with open(ROOT.parent / "shared" / "data" / "gsm8k" / "test.jsonl") as f:
        rows += [
            {"source": "gsm8k", "question": q["question"], "gold": final_answer(q["answer"])}
            for q in map(json.loads, list(f)[:4])
        ]
    llm = LLM(model=path, dtype="float32", enforce_eager=True, max_model_len=1024, seed=0, kv_cache_memory_bytes=2**30)
    params = SamplingParams(temperature=0.0, max_tokens=128)
    out = []
    for name, template in TEMPLATES.items():
        prompts = [{"prompt_token_ids": prompt_ids(tok, r["question"], None, template)} for r in rows]
        for r, res in zip(rows, llm.generate(prompts, params)):
            out.append({**r, "template": name, "completion": res.outputs[0].text})
    dest = Path(__file__).with_name("smollm2_answers.jsonl")
    dest.write_text("".join(json.dumps(o) + "\n" for o in out))
    print(f"wrote {len(out)} answers to {dest}")


if __name__ == "__main__":
    main()
