"""The GRPO learner: one Ray Train worker's loop, synchronous (eta = 0) or async (eta >= 1).

Rank 0 hosts the controller: a rollout producer (raypost.rl.producer) draws prompts in a
deterministic order, gets G rollouts per prompt from the Serve vLLM replicas, scores them with
the reward service and files them under admission control (raypost.rl.controller). Each step
rank 0 takes the next batch, at most ``async_rl.eta`` weight versions old, and broadcasts it.
Every rank recomputes log-probs of its slice under the current policy and steps the shared
loss with the configured off-policy correction. Rank 0 then publishes version k+1. Sync and
async differ only in eta: the learner and the loss are the same.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import ray.train
import torch

from raypost.algos import KL_ESTIMATORS, OFF_POLICY, POLICY_LOSSES, BatchCounts, LossParams
from raypost.config.grpo import GRPOConfig
from raypost.rl import groups as G
from raypost.rl.controller import RolloutController, StalenessAdmission
from raypost.rl.producer import RolloutProducer
from raypost.rl.tensors import collate, loss_tokens, sequences, token_logprobs, trim_to_completions
from raypost.train import checkpointing
from raypost.train.batches import micro_batches, to_device
from raypost.train.engine import all_sum, backward_share, setup_learner
from raypost.serve.channel import rollout_channel
from raypost.train.sync import broadcast_from_rank0, push_weights
from raypost.utils.metrics import MetricsLogger, Progress

log = logging.getLogger("raypost.grpo")


def _learn(engine: Any, ref: Any, rows: list[dict], cfg: GRPOConfig, pad_id: int) -> dict[str, float]:
    """One optimizer step over this rank's sequences of the global batch. The loss is
    normalized over the whole global batch (``BatchCounts`` summed over ranks). Returns the
    global batch's loss and the other loss metrics averaged over this rank's micro-batches."""
    algo = cfg.algo
    params = LossParams(eps_low=algo.eps_low, eps_high=algo.eps_high, beta=algo.beta, max_tokens=algo.max_new_tokens)
    loss_fn, kl_fn = POLICY_LOSSES.get_fn(algo.loss), KL_ESTIMATORS.get_fn(algo.kl_estimator)
    correct = OFF_POLICY.get_fn(cfg.async_rl.correction)
    counts = BatchCounts(*all_sum(float(len(rows)), float(loss_tokens(rows))))
    sums: dict[str, float] = {}
    share = 0.0
    chunks = list(micro_batches(rows, cfg.optim.micro_batch_size))
    for mb in chunks:
        b, keep = trim_to_completions(to_device(collate(mb, pad_id), engine.device))
        logits = engine(input_ids=b["input_ids"], attention_mask=b["attention_mask"], use_cache=False,
                        logits_to_keep=keep).logits
        logp, entropy = token_logprobs(logits, b["targets"], algo.temperature)
        kl = None
        if algo.beta > 0:
            with torch.no_grad():
                ref_logits = ref(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                                 logits_to_keep=keep).logits
            kl = kl_fn(logp, token_logprobs(ref_logits, b["targets"], algo.temperature)[0])
        # One update per batch: the proximal policy is this forward's own (pre-update) log-probs.
        anchor, weight, mask, m_is = correct(logp, logp.detach(), b["old_logp"], b["mask"], cfg.async_rl.is_cap)
        loss, m = loss_fn(logp, anchor, b["adv"], mask, params, kl, weight, counts)
        m.update(m_is)
        backward_share(engine, loss)
        engine.step()
        share += loss.item()
        m["entropy"] = float((entropy * b["mask"]).sum() / b["mask"].sum().clamp(min=1))
        for k, v in m.items():
            sums[k] = sums.get(k, 0.0) + v / len(chunks)
    (sums["loss"],) = all_sum(share)
    return sums


def _rollout_metrics(groups: list[G.Group]) -> dict[str, float]:
    samples = [s for g in groups for s in g.samples]
    rewards = torch.tensor([s.reward for s in samples])
    acc = [s.scores.get("accuracy") for s in samples if s.scores.get("accuracy") is not None]
    per_reward = {f"score_{name}": sum(s.scores[name] for s in samples) / len(samples)
                  for name in sorted({k for s in samples for k in s.scores})}
    return {"reward_mean": float(rewards.mean()), "reward_std": float(rewards.std()),
            "accuracy": sum(acc) / len(acc) if acc else float("nan"), **per_reward,
            "response_len": sum(len(s.completion_ids) for s in samples) / len(samples),
            "truncated_frac": sum(s.finish_reason == "length" for s in samples) / len(samples)}


def _batch(producer: RolloutProducer, cfg: GRPOConfig, state: checkpointing.ControllerState,
           base_cursor: int) -> tuple[list, dict]:
    """Rank 0: the next batch from the producer as sequences, with rollout and async metrics."""
    groups, wait_s = producer.take()
    state.cursor = base_cursor + producer.ctl.head
    seqs = sequences(groups, G.advantages(groups, cfg.algo))
    stale = torch.tensor([float(state.weight_version - s["version"]) for s in seqs])
    timing = [g.timing for g in groups]
    return seqs, {**_rollout_metrics(groups), **producer.stats(), "learner_wait_s": wait_s,
                  "generate_s": max(t["gen_end"] for t in timing) - min(t["gen_start"] for t in timing),
                  "reward_s": max(t["reward_s"] for t in timing), "staleness_max": float(stale.max()),
                  "staleness_p50": float(stale.quantile(0.5)), "staleness_p99": float(stale.quantile(0.99))}


def _start_producer(cfg: GRPOConfig, state: checkpointing.ControllerState, config: dict) -> RolloutProducer:
    """The rollout producer on rank 0, from the restored data cursor and weight version."""
    from ray import serve

    from raypost.serve.rollout_client import RolloutClient

    rows = iter(ray.train.get_dataset_shard("prompts").iter_rows())
    for _ in range(state.cursor):  # prompts consumed before the checkpoint
        next(rows)
    controller = RolloutController(StalenessAdmission(cfg.async_rl.eta, cfg.algo.prompts_per_step),
                                   G.dynamic_sampling(cfg.algo), version=state.weight_version)
    client = RolloutClient("rollout", config["weights_dir"], cfg.rollout.max_attempts, chunk=1,
                           transport=cfg.rollout.weight_transport)
    return RolloutProducer(controller, client, serve.get_app_handle("reward"), lambda: next(rows), cfg.algo).start()


def grpo_loop(config: dict[str, Any]) -> None:
    """Ray Train entry: config = {cfg, model_path, run_dir, weights_dir, grad_accum}."""
    from raypost.models.hf import load_causal_lm

    cfg = GRPOConfig.model_validate(config["cfg"])
    optim = cfg.optim.model_copy(update={"grad_accum": config["grad_accum"]})
    rank, world, tok, engine = setup_learner(cfg, config["model_path"], optim, cfg.algo.steps)
    # The frozen reference: on the learner's device, in the learner's precision.
    ref = (load_causal_lm(config["model_path"], cfg.deepspeed.precision).to(engine.device).eval()
           if cfg.algo.beta > 0 else None)
    state = checkpointing.restore(engine)
    if rank == 0:
        checkpointing.rewind_on_start(config["run_dir"], state, "grpo")
    zero, chan = cfg.deepspeed.zero_stage, rollout_channel(cfg.rollout, config["weights_dir"])
    push_weights(engine, zero, state.weight_version, chan, rank)  # replicas serve the restored weights
    producer = _start_producer(cfg, state, config) if rank == 0 else None
    logger = MetricsLogger(config["run_dir"], rank == 0, cfg.run.wandb_mode, run_name=cfg.run.name,
                           config=config["cfg"])
    progress, base_cursor = Progress(cfg.algo.steps, state.step, "grpo"), state.cursor
    started, waited = time.perf_counter(), 0.0
    try:
        while state.step < cfg.algo.steps:
            t0 = time.perf_counter()
            seqs, metrics = _batch(producer, cfg, state, base_cursor) if rank == 0 else (None, None)
            seqs, metrics = broadcast_from_rank0((seqs, metrics), rank)
            t1 = time.perf_counter()
            metrics.update(_learn(engine, ref, seqs[rank::world], cfg, tok.pad_token_id))
            metrics["train_s"] = time.perf_counter() - t1
            state.step, state.weight_version = state.step + 1, state.weight_version + 1
            state.cursor = broadcast_from_rank0(state.cursor, rank)
            metrics["push_s"] = push_weights(engine, zero, state.weight_version, chan, rank)
            if producer is not None:
                producer.advance(state.weight_version)
            tokens, waited = sum(len(s["ids"]) - s["start"] for s in seqs), waited + metrics["learner_wait_s"]
            metrics.update(step_s=time.perf_counter() - t0, weight_version=state.weight_version, phase="grpo",
                           gen_tokens_per_s=tokens / max(metrics["generate_s"], 1e-9),
                           trained_tokens_per_s=tokens / (time.perf_counter() - t0),
                           learner_wait_frac=waited / (time.perf_counter() - started))
            if rank == 0:
                _log_step(logger, progress, cfg, state, metrics, seqs, config["run_dir"])
            last = state.step == cfg.algo.steps
            if last or state.step % cfg.run.checkpoint_every == 0:
                exporter = checkpointing.hf_exporter(engine, cfg.deepspeed.zero_stage, tok, rank) if last else None
                checkpointing.save_and_report(engine, state, {"step": state.step, **metrics}, rank, exporter)
    finally:
        if producer is not None:
            producer.stop()
        chan.stop_serving()
    logger.finish()


def _log_step(logger: MetricsLogger, progress: Progress, cfg: GRPOConfig, state: checkpointing.ControllerState,
              metrics: dict, seqs: list, run_dir: str) -> None:
    logger.log(metrics, state.step)
    checkpointing.log_trained(run_dir, state.step, [s["sample_id"] for s in seqs])
    if state.step % cfg.run.log_every == 0 or state.step == cfg.algo.steps:
        log.info(progress.line(state.step, {k: metrics[k] for k in ("reward_mean", "accuracy", "loss",
                                                                      "gen_tokens_per_s", "staleness_max", "step_s")}))
