"""The floor under a GRPO step on this machine: raw vLLM generation of the step's rollouts plus
one bare PyTorch training step on them, with nothing around either (no Ray, no Serve, no
DeepSpeed, no reward service, no weight push).

For each step's prompts (the ones a raypost run trained on, in order), an offline vLLM engine
samples G completions per prompt (the run's temperature and token budget), then a plain loop
trains on those sequences: full forward, ``log_softmax`` of the completion positions,
-(advantage x log-prob) averaged over tokens, backward in micro-batches, AdamW. The engine and
the training share the process and the cores, one after the other, as in a synchronous step.

Called by ``benchmarks/grpo_vs_trl.py`` (the "limit" row); alone:

    .venv/bin/python -m benchmarks.grpo_limit --model smollm2-135m-instruct --prompts-json p.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

MARK = "GRPO_LIMIT "


def generate(llm, tok, steps: list[list[dict]], args: argparse.Namespace) -> list[tuple[float, list[dict]]]:
    """Per step: (seconds, sequences) from one ``llm.generate`` call of the step's prompts x G."""
    from vllm import SamplingParams

    from raypost.data.tokenize import prompt_ids
    from raypost.rewards.verifiers import answers_match

    params = SamplingParams(n=args.group_size, temperature=args.temperature, max_tokens=args.max_new_tokens)
    out = []
    for rows in steps:
        prompts = [prompt_ids(tok, r["question"], args.system) for r in rows]
        t0 = time.perf_counter()
        results = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        secs = time.perf_counter() - t0
        seqs = []
        for p, r, res in zip(prompts, rows, results):
            rewards = [float(answers_match(c.text, r["answer"], "flexible")) for c in res.outputs]
            mean = sum(rewards) / len(rewards)
            seqs += [
                {"ids": p + list(c.token_ids), "start": len(p), "adv": rw - mean} for c, rw in zip(res.outputs, rewards)
            ]
        out.append((secs, seqs))
    return out


def train_step(model, opt, seqs: list[dict], micro: int, pad: int) -> float:
    """One bare optimizer step over ``seqs``; returns its seconds."""
    import torch

    t0 = time.perf_counter()
    tokens = sum(len(s["ids"]) - s["start"] for s in seqs)
    for i in range(0, len(seqs), micro):
        mb = seqs[i : i + micro]
        t = max(len(s["ids"]) for s in mb)
        ids = torch.full((len(mb), t), pad, dtype=torch.long)
        mask = torch.zeros((len(mb), t - 1))
        for j, s in enumerate(mb):
            ids[j, : len(s["ids"])] = torch.tensor(s["ids"])
            mask[j, s["start"] - 1 : len(s["ids"]) - 1] = s["adv"]
        logits = model(input_ids=ids, attention_mask=(ids != pad).long()).logits[:, :-1]
        logp = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None])[..., 0]
        (-(logp * mask).sum() / tokens).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def child(args: argparse.Namespace) -> dict:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch
    from vllm import LLM

    from raypost.models.hf import load_causal_lm, load_tokenizer
    from raypost.models.named import resolve

    path = resolve(args.model)
    steps = json.loads(Path(args.prompts_json).read_text())
    llm = LLM(model=path, dtype="float32", max_model_len=1024, enforce_eager=True, kv_cache_memory_bytes=2**30)
    tok = load_tokenizer(path)
    gens = generate(llm, tok, steps, args)
    torch.set_num_threads(os.cpu_count() or 1)
    model = load_causal_lm(path)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95))
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    train_s = [train_step(model, opt, seqs, args.micro_batch, pad) for _, seqs in gens]
    return {
        "gen_s": [round(g, 3) for g, _ in gens],
        "train_s": [round(t, 3) for t in train_s],
        "gen_tokens": [sum(len(s["ids"]) - s["start"] for s in seqs) for _, seqs in gens],
    }


def summarize(res: dict, skip: int) -> dict:
    steps = [g + t for g, t in zip(res["gen_s"], res["train_s"])][skip:]
    return {
        "framework": "limit: raw vLLM + bare PyTorch",
        "median_step_s": statistics.median(steps),
        "median_generate_s": statistics.median(res["gen_s"][skip:]),
        "median_train_s": statistics.median(res["train_s"][skip:]),
        "gen_tokens_per_s": sum(res["gen_tokens"][skip:]) / sum(steps),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--prompts-json", required=True, help="[[{question, answer}, ...] per step]")
    ap.add_argument("--system", default=None, help="data.system_prompt of the run")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-5)
    args = ap.parse_args()
    print(MARK + json.dumps(child(args)), flush=True)


if __name__ == "__main__":
    main()
