"""The on-policy distillation learner: one Ray Train worker's loop.

Rank 0 is the controller: it draws prompts in a deterministic order, samples the student's
completions on its Serve vLLM replica (weight version k, with behaviour log-probs), and has
the teacher replica score those very tokens (vLLM prompt log-probs: per token, and the
teacher's top-k). Every rank recomputes the student's log-probs of its slice and steps the
loss; rank 0 then publishes version k+1 to the student replica.

Losses (``distill.on_policy_loss``):
  reverse_kl  the per-token reverse KL as a dense advantage (``algos.distill.on_policy_reverse_kl``);
  gkd         the divergence ``distill.divergence`` on the teacher's top-k at every sampled
              position (``algos.distill.kd_loss``; GKD with only on-policy data).
"""

from __future__ import annotations

import time
from typing import Any, Iterator

import ray.train
import torch

from raypost.algos.distill import KDParams, kd_loss, on_policy_reverse_kl
from raypost.config.distill import DistillConfig
from raypost.rewards.verifiers import answers_match
from raypost.rl.tensors import collate, loss_tokens, token_logprobs, trim_to_completions
from raypost.serve.weights import check_served
from raypost.train import checkpointing
from raypost.train.batches import micro_batches, to_device
from raypost.train.engine import all_sum, backward_share, setup_learner
from raypost.train.sampled import Sampler, run_steps


def collect(ctx: dict[str, Any], cfg: DistillConfig, pushed: int) -> tuple[list[dict], dict[str, float]]:
    """Rank 0: sample (with the weights of version ``pushed``, the last one published), have the
    teacher score, and build one dict per sequence."""
    d = cfg.distill
    rows = [next(ctx["rows"]) for _ in range(d.prompts_per_step)]
    t0 = time.perf_counter()
    outs = ctx["student"].generate([r["prompt_ids"] for r in rows], d.samples_per_prompt,
                                   {"temperature": d.on_policy_temperature, "max_tokens": d.max_new_tokens})
    t1 = time.perf_counter()
    for o in outs:
        check_served(o["version"], pushed, ctx["student"].weights_dir)
    seqs = [{"ids": list(r["prompt_ids"]) + list(c["token_ids"]), "start": len(r["prompt_ids"]), "old": c["logprobs"],
             "adv": 0.0, "train": len(c["token_ids"]) > 0, "version": o["version"], "sample_id": f"{r['id']}#{i}",
             "correct": answers_match(c["text"], r["answer"], cfg.eval.extract)}
            for r, o in zip(rows, outs) for i, c in enumerate(o["completions"])]
    top_k = d.top_k if d.on_policy_loss == "gkd" else 0
    scores = ctx["teacher"].score.remote([s["ids"] for s in seqs], [s["start"] for s in seqs], top_k).result()
    for s, sc in zip(seqs, scores):
        s.update(teacher=sc["logprobs"], top_ids=sc["top_ids"], top_logprobs=sc["top_logprobs"])
    gen_tokens = sum(len(s["ids"]) - s["start"] for s in seqs)
    return seqs, {"generate_s": t1 - t0, "teacher_s": time.perf_counter() - t1,
                  "gen_tokens_per_s": gen_tokens / max(t1 - t0, 1e-9), "response_len": gen_tokens / len(seqs),
                  "sample_accuracy": sum(s["correct"] for s in seqs) / len(seqs)}


def _teacher_tensors(rows: list[dict], t: int, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Teacher log-probs of the sampled tokens [N, T-1], and its top-k ids/log-probs [N, T-1, k],
    aligned with ``rl.tensors.collate``'s targets."""
    n, width = len(rows), max(k, 1)
    lp, top = torch.zeros(n, t - 1), torch.zeros(n, t - 1, width)
    ids = torch.zeros(n, t - 1, width, dtype=torch.long)
    for i, r in enumerate(rows):
        s, c = r["start"], len(r["teacher"])
        lp[i, s - 1:s - 1 + c] = torch.tensor(r["teacher"], dtype=torch.float32)
        if k:
            ids[i, s - 1:s - 1 + c] = torch.tensor(r["top_ids"], dtype=torch.long).reshape(c, k)
            top[i, s - 1:s - 1 + c] = torch.tensor(r["top_logprobs"], dtype=torch.float32).reshape(c, k)
    return lp, ids, top


def learn(engine: Any, rows: list[dict], cfg: DistillConfig, pad_id: int) -> dict[str, float]:
    """One optimizer step over this rank's sequences of the global batch. Both losses are
    token means over the sampled tokens of the whole global batch (counted over all ranks).
    Returns the global batch's loss and the other metrics averaged over micro-batches."""
    d = cfg.distill
    k = d.top_k if d.on_policy_loss == "gkd" else 0
    kd = KDParams(divergence=d.divergence, beta=d.beta, temperature=d.temperature)
    (norm,) = all_sum(float(loss_tokens(rows)))
    sums: dict[str, float] = {}
    share = 0.0
    chunks = list(micro_batches(rows, d.on_policy_optim.micro_batch_size))
    for mb in chunks:
        b = collate(mb, pad_id)
        b["teacher_lp"], b["top_ids"], b["top_lp"] = _teacher_tensors(mb, b["input_ids"].shape[1], k)
        b, positions = trim_to_completions(to_device(b, engine.device))
        teacher_lp, top_ids, top_lp = b["teacher_lp"], b["top_ids"], b["top_lp"]
        logits = engine(input_ids=b["input_ids"], attention_mask=b["attention_mask"], use_cache=False,
                        logits_to_keep=positions).logits
        # log-probs at the sampling temperature, as the replica's behaviour log-probs are
        logp, _ = token_logprobs(logits, b["targets"], d.on_policy_temperature)
        if d.on_policy_loss == "gkd":
            keep = b["mask"] > 0
            total, _, m = kd_loss(logits[:, :-1][keep], top_ids[keep], top_lp[keep], torch.ones(int(keep.sum())), kd)
            loss = total / max(norm, 1.0)
            with torch.no_grad():  # the same diagnostics as the reverse-KL loss reports
                m["reverse_kl"] = float(((b["old_logp"] - teacher_lp) * b["mask"]).sum() / b["mask"].sum().clamp(min=1))
                m["ratio_mean"] = float(((logp - b["old_logp"]).exp() * b["mask"]).sum() / b["mask"].sum().clamp(min=1))
        else:
            loss, m = on_policy_reverse_kl(logp, b["old_logp"], teacher_lp, b["mask"], norm)
        backward_share(engine, loss)
        engine.step()
        share += loss.item()
        for key, v in m.items():
            sums[key] = sums.get(key, 0.0) + v / len(chunks)
    (sums["loss"],) = all_sum(share)
    return sums


def _controller(cfg: DistillConfig, state: checkpointing.ControllerState, config: dict) -> dict[str, Any]:
    from ray import serve

    from raypost.serve.rollout_client import RolloutClient

    def cycle() -> Iterator[dict]:
        while True:  # the prompt order is long enough for the run; cycling only guards the end
            yield from ray.train.get_dataset_shard("prompts").iter_rows()

    rows = cycle()
    for _ in range(state.cursor):  # prompts consumed before the checkpoint
        next(rows)
    return {"rows": rows, "teacher": serve.get_app_handle(config["teacher_app"]),
            "student": RolloutClient(config["student_app"], config["weights_dir"], cfg.rollout.max_attempts,
                                     transport=cfg.rollout.weight_transport)}


def onpolicy_loop(config: dict[str, Any]) -> None:
    """Ray Train entry: config = {cfg, model_path, run_dir, weights_dir, student_app, teacher_app}."""
    cfg = DistillConfig.model_validate(config["cfg"])
    d = cfg.distill
    optim = d.on_policy_optim.model_copy(update={"grad_accum": config["grad_accum"]})
    rank, world, tok, engine = setup_learner(cfg, config["model_path"], optim, d.on_policy_steps)
    state = checkpointing.restore(engine)
    ctx = _controller(cfg, state, config) if rank == 0 else None

    def take(st: checkpointing.ControllerState) -> tuple[list[dict], dict[str, float]]:
        st.cursor += d.prompts_per_step
        return collect(ctx, cfg, st.weight_version)

    sampler = Sampler(
        phase="on_policy", label="on-policy distill", steps=d.on_policy_steps,
        shown=("loss", "reverse_kl", "kd", "sample_accuracy", "gen_tokens_per_s", "step_s"), take=take,
        learn=lambda rows: learn(engine, rows, cfg, tok.pad_token_id),
        extra=lambda seqs, m, step_s: {"staleness_max": max(state.weight_version - 1 - s["version"] for s in seqs)})
    run_steps(cfg, config, rank, world, engine, tok, state, sampler)
