"""The on-policy distillation learner: one Ray Train worker's loop.

Rank 0 is the controller: it draws prompts in a deterministic order, samples the student's
completions on its Serve vLLM replica (weight version k, with behaviour log-probs), and has
the teacher replica score those very tokens (vLLM prompt log-probs: per token, and the
teacher's top-k). Every rank recomputes the student's log-probs of its slice and steps the
loss; rank 0 then publishes version k+1 to the student replica.

The losses (``distill.on_policy_loss``) are in ``train.steps.onpolicy``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import ray.train

from raypost.config.distill import DistillConfig
from raypost.rewards.verifiers import answers_match
from raypost.rl.records import Sequence
from raypost.train import checkpointing
from raypost.train.engine import setup_learner
from raypost.train.loop import LoopConfig
from raypost.train.sampled import Sampler, run_steps
from raypost.train.steps import onpolicy as step
from raypost.weights import check_served


def collect(ctx: dict[str, Any], cfg: DistillConfig, pushed: int) -> tuple[list[Sequence], dict[str, float]]:
    """Rank 0: sample (with the weights of version ``pushed``, the last one published), have the
    teacher score, and build one ``Sequence`` per sample."""
    d = cfg.distill
    rows = [next(ctx["rows"]) for _ in range(d.prompts_per_step)]
    t0 = time.perf_counter()
    outs = ctx["student"].generate(
        [r["prompt_ids"] for r in rows],
        d.samples_per_prompt,
        {"temperature": d.on_policy_temperature, "max_tokens": d.max_new_tokens},
    )
    t1 = time.perf_counter()
    for o in outs:
        check_served(o["version"], pushed, ctx["student"].channel.describe())
    seqs = [
        Sequence(
            ids=list(r["prompt_ids"]) + list(c["token_ids"]),
            start=len(r["prompt_ids"]),
            old=c["logprobs"],
            sample_id=f"{r['id']}#{i}",
            train=len(c["token_ids"]) > 0,
            version=o["version"],
            correct=bool(answers_match(c["text"], r["answer"], cfg.eval.extract)),
        )
        for r, o in zip(rows, outs)
        for i, c in enumerate(o["completions"])
    ]
    top_k = d.top_k if d.on_policy_loss == "gkd" else 0
    scores = ctx["teacher"].score.remote([s.ids for s in seqs], [s.start for s in seqs], top_k).result()
    for s, sc in zip(seqs, scores):
        s.teacher, s.top_ids, s.top_logprobs = sc["logprobs"], sc["top_ids"], sc["top_logprobs"]
    gen_tokens = sum(s.completion_len for s in seqs)
    return seqs, {
        "generate_s": t1 - t0,
        "teacher_s": time.perf_counter() - t1,
        "gen_tokens_per_s": gen_tokens / max(t1 - t0, 1e-9),
        "response_len": gen_tokens / len(seqs),
        "sample_accuracy": sum(bool(s.correct) for s in seqs) / len(seqs),
    }


def _controller(cfg: DistillConfig, state: checkpointing.ControllerState, lc: LoopConfig) -> dict[str, Any]:
    from ray import serve

    from raypost.serve.rollout_client import RolloutClient

    def cycle() -> Iterator[dict]:
        while True:  # the prompt order is long enough for the run; cycling only guards the end
            yield from ray.train.get_dataset_shard("prompts").iter_rows()

    rows = cycle()
    for _ in range(state.cursor):  # prompts consumed before the checkpoint
        next(rows)
    return {
        "rows": rows,
        "teacher": serve.get_app_handle(lc.apps["teacher"]),
        "student": RolloutClient.of(lc.apps["student"], lc.channel, cfg.rollout),
    }


def onpolicy_loop(config: dict[str, Any]) -> None:
    """Ray Train entry: ``config["loop"]``, a ``LoopConfig`` with the weight channel and the
    student and teacher apps."""
    lc = LoopConfig.of(config)
    cfg = DistillConfig.model_validate(lc.cfg)
    d = cfg.distill
    optim = d.on_policy_optim.model_copy(update={"grad_accum": lc.grad_accum})
    rank, world, tok, engine = setup_learner(cfg, lc.model_path, optim, d.on_policy_steps)
    state = checkpointing.restore(engine)
    ctx = _controller(cfg, state, lc) if rank == 0 else None

    def take(st: checkpointing.ControllerState) -> tuple[list[Sequence], dict[str, float]]:
        st.cursor += d.prompts_per_step
        return collect(ctx, cfg, st.weight_version)

    sampler = Sampler(
        phase="on_policy",
        label="on-policy distill",
        steps=d.on_policy_steps,
        shown=("loss", "reverse_kl", "kd", "sample_accuracy", "gen_tokens_per_s", "step_s"),
        take=take,
        learn=lambda rows: step.learn(engine, rows, cfg, tok.pad_token_id),
        extra=lambda seqs, m, step_s: {"staleness_max": max(state.weight_version - 1 - s.version for s in seqs)},
    )
    run_steps(cfg, lc, rank, world, engine, tok, state, sampler)
