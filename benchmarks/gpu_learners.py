"""gpu_check's learner checks: each learner's real step, and the GRPO learner's MFU.

Both run under the process group Ray Train makes on the workers (NCCL alone on a GPU, gloo on
CPUs; one rank), through the engine the learners build, with no Ray or vLLM imported:

- learner_steps: SFT, offline KD, GRPO (with its KL to the frozen reference), on-policy distillation (GKD)
  and the reward model each take two optimizer steps with their own step function
  (``raypost.train.steps``) on an engine from ``build_learner``, in the learner's precision.
  Every loss is finite and every step changes the weights.
- learner_mfu: the GRPO step on the Qwen2.5-0.5B shape (random weights), bf16, ZeRO-2, on 64
  sequences of 256 prompt tokens and 480-768 completion tokens, against a bare PyTorch step on
  the same batch and precision (bf16 autocast, fp32 master weights, AdamW, padded micro-batches).
  MFU = 6 * parameters * tokens / step seconds / the chip's dense bf16 peak.
"""

from __future__ import annotations

import os
import random
import statistics
import time
import traceback
from collections.abc import Callable
from typing import Any

PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12}  # dense bf16 FLOP/s by chip


def process_group(ctx: dict[str, Any]) -> None:
    """One rank of the group Ray Train's ``TorchConfig`` makes: NCCL on a GPU, else gloo, with
    the environment its workers get (DeepSpeed reads it)."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    from benchmarks.gpu_check import free_port

    port = free_port()
    os.environ.update(
        RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    dist.init_process_group(
        backend="nccl" if ctx["device"] == "cuda" else "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=0,
        world_size=1,
    )


def _learner(
    cfg_cls: Any, doc: dict[str, Any], ctx: dict[str, Any], optim_of: Callable[[Any], Any], load: Any = None
) -> tuple[Any, Any, Any]:
    from raypost.train.engine import build_learner, prepare_model

    doc = {
        **doc,
        "resources": {"num_workers": 1, "cpus_per_worker": 0.5},
        "deepspeed": {"zero_stage": 2, "precision": ctx["precision"]},
    }
    cfg = cfg_cls.model_validate(doc)
    tok, engine = build_learner(cfg, str(ctx["model"]), optim_of(cfg), 2, 1, 1, load or prepare_model)
    return cfg, tok, engine


def _sft(kd: dict[str, Any] | None) -> Callable[[dict[str, Any]], tuple[Any, Callable[[], float]]]:
    def make(ctx: dict[str, Any]) -> tuple[Any, Callable[[], float]]:
        from raypost.config import SFTConfig
        from raypost.train.objectives import objective_for
        from raypost.train.steps.sft import train_step
        from tests.harness.rows import sft_rows

        cfg, tok, engine = _learner(
            SFTConfig, {"optim": {"micro_batch_size": 2, "grad_accum": 4}}, ctx, lambda c: c.optim
        )
        rows = sft_rows(tok.vocab_size, teacher=kd is not None)
        return engine, lambda: train_step(engine, rows, tok.pad_token_id, 2, objective_for(kd))[0]

    return make


def _grpo(ctx: dict[str, Any]) -> tuple[Any, Callable[[], float]]:
    from raypost.config.grpo import GRPOConfig
    from raypost.models.hf import load_causal_lm
    from raypost.train.steps.grpo import learn
    from tests.harness.rows import rl_rows

    doc = {
        "algo": {"beta": 0.05, "kl_estimator": "k3", "group_size": 4, "prompts_per_step": 2, "max_new_tokens": 64},
        "optim": {"micro_batch_size": 2},
    }
    cfg, tok, engine = _learner(GRPOConfig, doc, ctx, lambda c: c.optim.model_copy(update={"grad_accum": 4}))
    ref = load_causal_lm(str(ctx["model"]), ctx["precision"]).to(engine.device).eval()
    rows = rl_rows(tok.vocab_size)
    return engine, lambda: learn(engine, ref, rows, cfg, tok.pad_token_id)["loss"]


def _on_policy(ctx: dict[str, Any]) -> tuple[Any, Callable[[], float]]:
    from raypost.config.distill import DistillConfig
    from raypost.train.steps.onpolicy import learn
    from tests.harness.rows import K, rl_rows

    doc = {
        "distill": {
            "mode": "on_policy",
            "on_policy_loss": "gkd",
            "top_k": K,
            "divergence": "jsd",
            "prompts_per_step": 4,
            "samples_per_prompt": 2,
            "on_policy_optim": {"micro_batch_size": 2},
        }
    }
    cfg, tok, engine = _learner(
        DistillConfig, doc, ctx, lambda c: c.distill.on_policy_optim.model_copy(update={"grad_accum": 4})
    )
    rows = rl_rows(tok.vocab_size, teacher=True)
    return engine, lambda: learn(engine, rows, cfg, tok.pad_token_id)["loss"]


def _reward_model(ctx: dict[str, Any]) -> tuple[Any, Callable[[], float]]:
    from raypost.config.reward_model import RewardModelConfig
    from raypost.train.steps.rm import load_reward_model, train_step
    from tests.harness.rows import rm_rows

    cfg, tok, engine = _learner(
        RewardModelConfig,
        {"optim": {"micro_batch_size": 2, "grad_accum": 4}},
        ctx,
        lambda c: c.optim,
        load_reward_model,
    )
    rows = rm_rows(tok.vocab_size)
    return engine, lambda: train_step(engine, rows, cfg, tok.pad_token_id)["loss"]


def _dpo(ctx: dict[str, Any]) -> tuple[Any, Callable[[], float]]:
    from raypost.config.dpo import DPOConfig
    from raypost.models.hf import load_causal_lm
    from raypost.train.steps.dpo import learn
    from tests.harness.rows import dpo_rows

    cfg, tok, engine = _learner(DPOConfig, {"optim": {"micro_batch_size": 2, "grad_accum": 4}}, ctx, lambda c: c.optim)
    ref = load_causal_lm(str(ctx["model"]), ctx["precision"]).to(engine.device).eval()
    rows = dpo_rows(tok.vocab_size)
    return engine, lambda: learn(engine, ref, rows, cfg, tok.pad_token_id)["loss"]


def _ppo(ctx: dict[str, Any]) -> tuple[Any, Callable[[], float]]:
    """The PPO step: the critic's values and GAE, the policy's update, the critic's update."""
    from raypost.config.ppo import PPOConfig
    from raypost.models.hf import DTYPES
    from raypost.train.engine import build_engine
    from raypost.train.steps.ppo import learn
    from tests.harness.learner_equivalence import value_model
    from tests.harness.rows import ppo_rows

    doc = {"algo": {"loss": "dapo", "group_size": 4, "prompts_per_step": 2, "max_new_tokens": 64}}
    doc["optim"] = {"micro_batch_size": 2}
    cfg, tok, engine = _learner(PPOConfig, doc, ctx, lambda c: c.optim.model_copy(update={"grad_accum": 4}))
    critic_model = value_model(str(ctx["model"])).to(DTYPES[ctx["precision"]])
    critic_optim = cfg.critic.optim.model_copy(update={"grad_accum": 4, "micro_batch_size": 2})
    critic = build_engine(critic_model, critic_optim, cfg.deepspeed, 2, 1)
    rows = ppo_rows(tok.vocab_size)
    return engine, lambda: learn(engine, critic, None, rows, cfg, tok.pad_token_id, True)["loss"]


LEARNERS = {
    "sft": _sft(None),
    "offline_kd": _sft({"divergence": "forward_kl", "temperature": 2.0, "kd_weight": 0.7}),
    "grpo": _grpo,
    "on_policy": _on_policy,
    "reward_model": _reward_model,
    "dpo": _dpo,
    "ppo": _ppo,
}


def _weights(engine: Any) -> Any:
    import torch

    return torch.cat([p.detach().float().flatten().cpu() for p in engine.module.parameters()])


def check_learner_steps(ctx: dict[str, Any]) -> dict[str, Any]:
    import math

    import torch.distributed as dist

    process_group(ctx)
    out: dict[str, Any] = {"backend": dist.get_backend_config(), "learners": {}}
    for name, make in LEARNERS.items():
        try:
            engine, step = make(ctx)
            before = _weights(engine)
            losses = [step() for _ in range(2)]
        except Exception as err:  # noqa: BLE001 - one learner's failure is reported, the others still run
            out["learners"][name] = {
                "ok": False,
                "error": f"{type(err).__name__}: {err}",
                "trace": traceback.format_exc()[-2000:],
            }
            continue
        moved = float((_weights(engine) - before).norm())
        out["learners"][name] = {
            "losses": losses,
            "weights_moved": moved,
            "device": str(engine.device),
            "ok": all(math.isfinite(v) for v in losses) and moved > 0,
        }
        del engine
    out["ok"] = all(r["ok"] for r in out["learners"].values())
    return out


# -- MFU on the Qwen2.5-0.5B shape ------------------------------------------------------------
QWEN05 = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "max_position_embeddings": 32768,
    "rope_theta": 1e6,
}


def mfu_rows(n: int = 64, prompt: int = 256, lo: int = 480, hi: int = 768, vocab: int = 151936) -> list[Any]:
    """GRPO sequences: groups of 8 share a prompt; completions of 480-768 tokens."""
    from raypost.rl.records import Sequence

    rng = random.Random(0)
    rows = []
    for g in range(n // 8):
        p = [rng.randrange(10, vocab) for _ in range(prompt)]
        for i in range(8):
            c = rng.randrange(lo, hi + 1)
            rows.append(
                Sequence(
                    ids=p + [rng.randrange(10, vocab) for _ in range(c)],
                    start=prompt,
                    old=[-rng.uniform(0.5, 6.0) for _ in range(c)],
                    adv=rng.uniform(-1.5, 1.5),
                    sample_id=f"{g}#{i}",
                )
            )
    return rows


def _qwen05(seed: int = 0) -> Any:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    return Qwen2ForCausalLM(Qwen2Config(**QWEN05, attn_implementation="sdpa"))


def _bare_step(model: Any, opt: Any, rows: list[Any], micro: int, device: str) -> None:
    """A naive padded step: full logits, log-softmax, token-mean policy gradient, AdamW."""
    import torch

    from raypost.rl.tensors import collate

    n_tokens = sum(r.completion_len for r in rows)
    for a in range(0, len(rows), micro):
        b = collate(rows[a : a + micro], 0).to(device)
        with torch.autocast(device, dtype=torch.bfloat16):
            logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits[:, :-1]
        logp = torch.log_softmax(logits.float(), -1).gather(-1, b.targets[..., None])[..., 0]
        ratio = (logp - b.old_logp).exp()
        loss = -(ratio * b.adv[:, None] * b.mask).sum() / n_tokens
        loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _timed(step: Callable[[], Any], warmup: int, repeats: int, sync: Callable[[], None]) -> list[float]:
    for _ in range(warmup):
        step()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    return times


def check_learner_mfu(ctx: dict[str, Any]) -> dict[str, Any]:
    import torch

    from raypost.config import DeepSpeedConfig
    from raypost.config.grpo import GRPOConfig
    from raypost.train.engine import build_engine
    from raypost.train.steps.grpo import learn

    process_group(ctx)
    micro = 8
    rows = mfu_rows()
    tokens = sum(len(r.ids) for r in rows)
    cfg = GRPOConfig.model_validate(
        {
            "algo": {"beta": 0.0, "group_size": 8, "prompts_per_step": 8, "max_new_tokens": 768},
            "optim": {"micro_batch_size": micro},
        }
    )
    chip = next((k for k in PEAK_BF16 if k in torch.cuda.get_device_name(0)), None)
    peak = PEAK_BF16.get(chip, 989e12)
    sync = torch.cuda.synchronize
    params = sum(p.numel() for p in _qwen05().parameters())

    def raypost_times() -> list[float]:  # the engine is freed on return, before the bare loop's model
        engine = build_engine(
            _qwen05(),
            cfg.optim.model_copy(update={"grad_accum": len(rows) // micro}),
            DeepSpeedConfig(zero_stage=2, precision="bf16"),
            100,
            1,
        )
        return _timed(lambda: learn(engine, None, rows, cfg, 0), 2, 5, sync)

    raypost_s = raypost_times()
    torch.cuda.empty_cache()
    bare = _qwen05().to("cuda")
    opt = torch.optim.AdamW(bare.parameters(), lr=1e-6)
    bare_s = _timed(lambda: _bare_step(bare, opt, rows, micro, "cuda"), 2, 5, sync)

    def row(times: list[float]) -> dict[str, float]:
        med = statistics.median(times)
        return {"step_s": med, "tokens_per_s": tokens / med, "mfu": 6 * params * tokens / med / peak, "times": times}

    ours, naive = row(raypost_s), row(bare_s)
    return {
        "ok": True,
        "shape": "Qwen2.5-0.5B",
        "parameters": params,
        "tokens": tokens,
        "peak_flops": peak,
        "micro_batch": micro,
        "raypost": ours,
        "bare_pytorch": naive,
        "raypost_over_bare": naive["step_s"] / ours["step_s"],
    }
