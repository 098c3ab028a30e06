"""The GPU paths of the learners and a replica, checked in one script: under 8 minutes on one GPU.

For a session lent a GPU machine: run it there, and the README's GPU status line changes from
"not yet run on a GPU" to what it measured. Each check is skipped, with its reason, when this
machine cannot run it (no GPU, a package missing, one GPU where two are needed):

1. learner_on_device: a GRPO step as the learner takes it (``collate``, ``LearnerBatch.to``,
   ``token_logprobs``, the registered policy loss with its KL to the frozen reference): every
   tensor on the device, the policy and the reference in the learner's precision; the loss and
   the gradient match the same step in fp32 on the CPU.
2. zero3_push: a one-rank ZeRO-3 DeepSpeed engine on the device; ``weight_buckets`` gathers it in
   small buckets: the pushed weights equal the model's, and on a GPU the device's peak memory
   during the push stays under the model plus two buckets.
3. learner_steps: SFT, GRPO, on-policy distillation and the reward model each take two steps with
   their own step function on the engine ``build_learner`` makes, under the process group Ray
   Train makes on the workers (NCCL alone on a GPU): finite losses, weights moved
   (``benchmarks/gpu_learners.py``). Needs only torch, transformers, DeepSpeed and pydantic.
4. learner_mfu (GPU only): the GRPO step's tokens/s and MFU on the Qwen2.5-0.5B shape, beside a
   bare PyTorch step on the same batch and precision.
5. replica_push: the rollout Serve app with its vLLM engine on the device, weights pushed through
   the object_store channel (Ray's object store, then a memfd that the engine's worker process
   maps): greedy tokens equal transformers' on the pushed weights, log-probs within 1e-2.
6. collective_nccl: the collective transport's NCCL path, learner rank 0 on GPU 0 and a receiver on
   GPU 1 (NCCL cannot put two ranks on one GPU): every tensor arrives intact.

    python -m benchmarks.gpu_check                  # the device: cuda when there is one
    python -m benchmarks.gpu_check --device cpu     # the same checks on CPUs (tests/integration/test_gpu_check.py)

Prints a table and writes gpu_check.json into $OUT, or --out.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.gpu_learners import check_learner_mfu, check_learner_steps, process_group


def missing(*modules: str) -> str | None:
    gone = [m for m in modules if importlib.util.find_spec(m) is None]
    return f"not installed here: {', '.join(gone)}" if gone else None


def tiny_model(work: Path) -> Path:
    from raypost.config import TinyModelConfig
    from raypost.data import synthetic
    from raypost.models.tiny import build_tiny_model

    rows = synthetic.generate(500, seed=7)
    return build_tiny_model(
        TinyModelConfig(), [r["question"] for r in rows] + [r["answer"] for r in rows], work / "tiny"
    )


def grpo_step(model_path: Path, device: str, precision: str) -> tuple[float, dict[str, Any], list[str]]:
    """One GRPO loss and backward on ``device``: (loss, gradients on the CPU, devices seen)."""
    import torch

    from raypost.algos import KL_ESTIMATORS, POLICY_LOSSES, BatchCounts, LossParams
    from raypost.models.hf import load_causal_lm
    from raypost.rl.records import Sequence
    from raypost.rl.tensors import collate, loss_tokens, token_logprobs, trim_to_completions

    torch.manual_seed(0)
    policy = load_causal_lm(str(model_path), precision).to(device)
    ref = load_causal_lm(str(model_path), precision).to(device).eval()
    g = torch.Generator().manual_seed(1)
    vocab = policy.config.vocab_size
    rows = [
        Sequence(
            ids=torch.randint(5, vocab, (6 + 3 * i,), generator=g).tolist(),
            start=4,
            adv=1.0 - i,
            old=[-1.0] * (2 + 3 * i),
            sample_id=f"{i}#0",
        )
        for i in range(3)
    ]
    b, keep = trim_to_completions(collate(rows, 0).to(torch.device(device)))
    logits = policy(input_ids=b.input_ids, attention_mask=b.attention_mask, logits_to_keep=keep).logits
    logp, _ = token_logprobs(logits, b.targets, 1.0)
    with torch.no_grad():
        ref_logits = ref(input_ids=b.input_ids, attention_mask=b.attention_mask, logits_to_keep=keep).logits
        ref_logp, _ = token_logprobs(ref_logits, b.targets, 1.0)
    kl = KL_ESTIMATORS.get_fn("k3")(logp, ref_logp)
    counts = BatchCounts(float(len(rows)), float(loss_tokens(rows)))
    params = LossParams(eps_low=0.2, eps_high=0.2, beta=0.05, max_tokens=16)
    loss, _ = POLICY_LOSSES.get_fn("grpo")(logp, b.old_logp, b.adv, b.mask, params, kl, torch.ones_like(b.mask), counts)
    loss.backward()
    seen = sorted({str(t.device) for t in (b.input_ids, b.mask, logits, ref_logits, *policy.parameters())})
    grads = {k: p.grad.float().cpu() for k, p in policy.named_parameters() if p.grad is not None}
    return float(loss), grads, seen


def check_learner_on_device(ctx: dict[str, Any]) -> dict[str, Any]:
    device, precision = ctx["device"], ctx["precision"]
    loss, grads, seen = grpo_step(ctx["model"], device, precision)
    ref_loss, ref_grads, _ = grpo_step(ctx["model"], "cpu", "fp32")
    num = sum(float((grads[k] - ref_grads[k]).norm() ** 2) for k in ref_grads) ** 0.5
    den = sum(float(v.norm() ** 2) for v in ref_grads.values()) ** 0.5
    tol = 1e-4 if precision == "fp32" else 5e-2
    ok = seen == [str(__import__("torch").device(device if device != "cuda" else "cuda:0"))] and num / den < tol
    return {"ok": ok, "devices": seen, "loss": loss, "cpu_loss": ref_loss, "grad_rel_err": num / den, "tol": tol}


def check_zero3_push(ctx: dict[str, Any]) -> dict[str, Any]:
    import deepspeed
    import torch

    from raypost.config import DeepSpeedConfig, OptimConfig
    from raypost.models.hf import load_causal_lm
    from raypost.train.engine import deepspeed_config, init_distributed
    from raypost.weights.buckets import weight_buckets

    process_group(ctx)
    init_distributed()
    model = load_causal_lm(str(ctx["model"]), "fp32")
    want = {k: v.clone() for k, v in model.state_dict().items()}
    config = deepspeed_config(DeepSpeedConfig(zero_stage=3), OptimConfig(micro_batch_size=1), 1)
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.0), config=config)
    bucket = 16 << 10
    cuda = ctx["device"] == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    specs, buckets = weight_buckets(engine, 3, bucket)
    got = {k: v for b in buckets for k, v in b.items()}
    push_s = time.perf_counter() - t0
    model_bytes = sum(v.numel() * v.element_size() for v in want.values())
    peak = (torch.cuda.max_memory_allocated() - base) if cuda else None
    same = [s[0] for s in specs] == list(got) and all(torch.equal(got[k], want[k].cpu()) for k in got)
    ok = same and (peak is None or peak <= model_bytes + 2 * bucket)
    return {
        "ok": ok,
        "same_weights": same,
        "tensors": len(got),
        "push_s": push_s,
        "model_bytes": model_bytes,
        "device_peak_bytes": peak,
    }


def _init_ray(address: str | None, cuda: bool) -> None:
    import ray

    if address:  # a running cluster (the test suite's)
        ray.init(address=address, log_to_driver=False)
    else:
        tmp = tempfile.mkdtemp(prefix="rgc", dir="/tmp")
        ray.init(num_cpus=2, num_gpus=1 if cuda else 0, include_dashboard=False, _temp_dir=tmp)


def _compare(model: Any, prompts: list[list[int]], got: list[dict], device: str) -> tuple[bool, float]:
    """Whether the replica's greedy tokens are the model's, and the largest log-prob gap."""
    import torch

    tokens_equal, worst = True, 0.0
    for p, out in zip(prompts, got):
        c = out["completions"][0]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([p + c["token_ids"]], device=device)).logits[0, len(p) - 1 : -1]
        lps = torch.log_softmax(logits.float(), -1)
        tokens_equal &= lps.argmax(-1).tolist() == c["token_ids"]
        want = lps.gather(1, torch.tensor(c["token_ids"], device=device)[:, None])[:, 0].tolist()
        worst = max(worst, *(abs(a - b) for a, b in zip(c["logprobs"], want)))
    return tokens_equal, worst


def check_replica_push(ctx: dict[str, Any]) -> dict[str, Any]:
    import ray
    import torch
    from ray import serve

    from raypost.config import build
    from raypost.config.serve import RolloutConfig
    from raypost.data import prompt_ids, synthetic
    from raypost.models.hf import load_causal_lm, load_tokenizer
    from raypost.serve.rollout_app import build_app
    from raypost.serve.rollout_client import RolloutClient

    cuda = ctx["device"] == "cuda"
    cfg = build(
        RolloutConfig,
        {
            "num_replicas": 1,
            "cpus_per_replica": 1,
            "gpus_per_replica": 1 if cuda else 0,
            "max_model_len": 256,
            "dtype": "float32",
            "weights": {"transport": "object_store"},
            "gpu_memory_utilization": 0.3,
        },
    )
    tok = load_tokenizer(str(ctx["model"]))
    prompts = [prompt_ids(tok, r["question"], None) for r in synthetic.generate(4, seed=11)]
    model = load_causal_lm(str(ctx["model"]))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    _init_ray(ctx["ray_address"], cuda)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": free_port()})
        from raypost.weights import open_channel

        chan = open_channel(cfg, f"gpu-check-{os.getpid()}")
        serve.run(build_app(str(ctx["model"]), cfg, chan), name=APP, route_prefix=None)
        client = RolloutClient(APP, chan)
        push_s = client.update_weights(1, state)
        got = client.generate(prompts, 1, {"temperature": 0.0, "max_tokens": 12})
    finally:
        serve.delete(APP)
        if "chan" in locals():
            chan.close()
        ray.shutdown()
    tokens_equal, worst = _compare(model.to(ctx["device"]).eval(), prompts, got, ctx["device"])
    ok = tokens_equal and worst < 1e-2 and all(o["version"] == 1 for o in got)
    return {"ok": ok, "greedy_tokens_equal": tokens_equal, "max_logprob_diff": worst, "push_s": push_s}


def check_collective_nccl(ctx: dict[str, Any]) -> dict[str, Any]:
    import subprocess

    import torch

    from raypost.weights import specs_of
    from raypost.weights.collective import WeightServer

    g = torch.Generator().manual_seed(0)
    state = {"embed": torch.randn(1000, 512, generator=g), "norm": torch.randn(64, generator=g)}
    server = WeightServer("127.0.0.1", backend="nccl", bucket_bytes=1 << 20)
    try:
        server.offer(1, specs_of(state), [state])
        code = (
            "import json, sys, torch; from raypost.weights.collective import request, receive; "
            "src = request(json.loads(sys.argv[1]), 1); "
            "print(json.dumps({k: float(v.double().sum()) for k, v in receive(src, 0, 'cuda:0')}))"
        )
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": "1"}
        out = subprocess.run(
            [sys.executable, "-c", code, json.dumps(server.address)],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
            cwd=Path(__file__).resolve().parents[1],
        )
        sums = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else {}
    finally:
        server.stop()
    ok = sums.keys() == state.keys() and all(abs(sums[k] - float(v.double().sum())) < 1e-3 for k, v in state.items())
    return {"ok": ok, "sums": sums, "stderr": out.stderr[-2000:] if out.returncode else ""}


APP = "gpu-check-rollout"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CHECKS: dict[str, tuple[Callable[[dict[str, Any]], dict[str, Any]], Callable[[dict[str, Any]], str | None]]] = {
    "learner_on_device": (check_learner_on_device, lambda ctx: missing("transformers")),
    "zero3_push": (check_zero3_push, lambda ctx: missing("deepspeed")),
    "learner_steps": (check_learner_steps, lambda ctx: missing("deepspeed", "pydantic")),
    "learner_mfu": (check_learner_mfu, lambda ctx: missing("deepspeed") or (None if ctx["gpus"] else "needs a GPU")),
    "replica_push": (check_replica_push, lambda ctx: missing("ray", "vllm")),
    "collective_nccl": (check_collective_nccl, lambda ctx: "needs 2 GPUs" if ctx["gpus"] < 2 else None),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda when there is one")
    ap.add_argument("--checks", nargs="+", choices=list(CHECKS), default=list(CHECKS))
    ap.add_argument("--ray-address", default=None, help="join this Ray cluster for replica_push (default: start one)")
    ap.add_argument("--out", default=str(Path(os.environ.get("OUT", "benchmarks/out")) / "gpu_check.json"))
    args = ap.parse_args()
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    gpus = torch.cuda.device_count() if device == "cuda" else 0
    ctx: dict[str, Any] = {
        "device": device,
        "gpus": gpus,
        "precision": "bf16" if device == "cuda" else "fp32",
        "ray_address": args.ray_address,
    }
    results: dict[str, Any] = {
        "device": device,
        "gpu": torch.cuda.get_device_name(0) if gpus else None,
        "torch": torch.__version__,
        "checks": {},
    }
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as work:
        ctx["model"] = tiny_model(Path(work))
        for name in args.checks:
            run, why_not = CHECKS[name]
            reason = why_not(ctx)
            t0 = time.perf_counter()
            if reason:
                res: dict[str, Any] = {"ok": None, "skipped": reason}
            else:
                try:
                    res = run(ctx)
                except Exception as err:  # noqa: BLE001 - reported in the table and the JSON
                    res = {
                        "ok": False,
                        "error": f"{type(err).__name__}: {err}",
                        "trace": traceback.format_exc()[-3000:],
                    }
            res["seconds"] = round(time.perf_counter() - t0, 1)
            results["checks"][name] = res
            print(
                f"{name}: {'skipped: ' + reason if reason else ('ok' if res['ok'] else 'FAILED')} ({res['seconds']} s)",
                flush=True,
            )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2, default=str))
    failed = [n for n, r in results["checks"].items() if r["ok"] is False]
    print(
        json.dumps(
            {n: {k: v for k, v in r.items() if k != "trace"} for n, r in results["checks"].items()},
            indent=1,
            default=str,
        )
    )
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
