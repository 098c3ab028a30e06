"""The learner's peak memory per step on SmolLM2-135M (49,152-token vocabulary): token log-probs
and entropy by a full fp32 log-softmax (what raypost did before) against the chunked, selective
``raypost.rl.tensors.token_logprobs``, side by side in one run.

Each variant runs in its own process: load the model, then one GRPO-shaped learner step
(forward, log-probs + entropy of the completion tokens, a policy-gradient loss, backward). The
figure is the step's peak resident memory (sampled every 2 ms) above the process's resident
memory just before the step, with the step's wall seconds.

  .venv/bin/python -m benchmarks.logprob_memory                 # 8 sequences x 256 tokens
  .venv/bin/python -m benchmarks.logprob_memory --batch 4 --seq 512
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from benchmarks.common import OUT, run_child, table

VARIANTS = ("full_log_softmax", "chunked")


def full_log_softmax(logits, targets, temperature):
    """The previous implementation: a [N, T, V] fp32 log-softmax, and its exp for the entropy."""
    import torch

    logp_all = torch.log_softmax(logits[:, :-1].float() / temperature, dim=-1)
    logp = logp_all.gather(-1, targets[..., None])[..., 0]
    with torch.no_grad():
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


class PeakRSS:
    """Resident memory sampled every 2 ms on a thread while the block runs; ``peak`` in bytes."""

    def __enter__(self) -> PeakRSS:
        import threading

        import psutil

        self._proc, self._stop, self.peak = psutil.Process(), threading.Event(), 0
        self.start = self._proc.memory_info().rss
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._proc.memory_info().rss)
            self._stop.wait(0.002)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def child(variant: str, model: str, batch: int, seq: int) -> dict:
    import gc

    import torch

    from raypost.models.hf import load_causal_lm
    from raypost.rl.tensors import token_logprobs

    torch.manual_seed(0)
    lm = load_causal_lm(model)
    lm.train()
    ids = torch.randint(0, lm.config.vocab_size, (batch, seq))
    fn = token_logprobs if variant == "chunked" else full_log_softmax
    gc.collect()
    with PeakRSS() as mem:
        t0 = time.perf_counter()
        logits = lm(input_ids=ids, use_cache=False).logits
        logp, entropy = fn(logits, ids[:, 1:], 0.9)
        loss = -(logp * torch.randn(batch, 1)).mean()
        loss.backward()
        step_s = time.perf_counter() - t0
    return {
        "variant": variant,
        "step_peak_mb": (mem.peak - mem.start) / 2**20,
        "step_s": step_s,
        "logits_mb": batch * seq * lm.config.vocab_size * 4 / 2**20,
        "entropy_mean": float(entropy.mean()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct", help="raypost name, HF id or path")
    ap.add_argument("--batch", type=int, default=8, help="sequences per micro-batch")
    ap.add_argument("--seq", type=int, default=256, help="tokens per sequence")
    ap.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.model, args.batch, args.seq)))
        return
    from raypost.models.named import resolve

    resolve(args.model)  # convert once, outside the measured children
    common = ["--model", args.model, "--batch", str(args.batch), "--seq", str(args.seq)]
    rows = [run_child(Path(__file__), ["--child", v, *common]) for v in VARIANTS]
    base = rows[0]["step_peak_mb"]
    print(
        table(
            f"learner step peak memory, {args.model}, {args.batch} x {args.seq} tokens "
            f"(one fp32 [N, T, V] = {rows[0]['logits_mb']:.0f} MB)",
            ["variant", "step peak MB", "ratio", "step s", "entropy mean"],
            [
                [
                    r["variant"],
                    f"{r['step_peak_mb']:.0f}",
                    f"{r['step_peak_mb'] / base:.2f}",
                    f"{r['step_s']:.1f}",
                    f"{r['entropy_mean']:.4f}",
                ]
                for r in rows
            ],
        )
    )
    OUT.mkdir(exist_ok=True)
    out = OUT / "logprob_memory.json"
    out.write_text(json.dumps({"model": args.model, "batch": args.batch, "seq": args.seq, "rows": rows}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
