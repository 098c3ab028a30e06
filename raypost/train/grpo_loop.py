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

import itertools
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import ray.train
import torch

from raypost.config.grpo import GRPOConfig
from raypost.rl import groups as G
from raypost.rl.controller import RolloutController, StalenessAdmission
from raypost.rl.producer import RolloutProducer
from raypost.rl.records import Sequence
from raypost.rl.tensors import sequences
from raypost.train import checkpointing
from raypost.train.engine import setup_learner
from raypost.train.loop import LoopConfig
from raypost.train.sampled import Sampler, run_steps
from raypost.train.steps import grpo as step

log = logging.getLogger("raypost.grpo")


def _rollout_metrics(groups: list[G.Group]) -> dict[str, float]:
    samples = [s for g in groups for s in g.samples]
    rewards = torch.tensor([s.reward for s in samples])
    acc = [s.scores.get("accuracy") for s in samples if s.scores.get("accuracy") is not None]
    per_reward: dict[str, float] = {}
    for name in sorted({k for s in samples for k in s.scores}):
        made = [s.scores[name] for s in samples if s.scores.get(name) is not None]
        per_reward[f"score_{name}"] = sum(made) / len(made) if made else float("nan")
        if len(made) < len(samples):  # a reward with no verdict (a timed-out check, TRL's None)
            per_reward[f"unscored_{name}"] = (len(samples) - len(made)) / len(samples)
    return {
        "reward_mean": float(rewards.mean()),
        "reward_std": float(rewards.std()),
        "accuracy": sum(acc) / len(acc) if acc else float("nan"),
        **per_reward,
        "response_len": sum(len(s.completion_ids) for s in samples) / len(samples),
        "truncated_frac": sum(s.finish_reason == "length" for s in samples) / len(samples),
        **_agent_metrics(samples),
    }


def _agent_metrics(samples: list[G.Sample]) -> dict[str, float]:
    """Multi-turn episodes: turns and tool calls per episode, the share that ended on a parse error."""
    if all(s.mask is None for s in samples):
        return {}
    n = len(samples)
    return {
        "turns": sum(s.turns for s in samples) / n,
        "tool_calls": sum(s.tool_calls for s in samples) / n,
        "parse_error_end_frac": sum(s.parse_error_end for s in samples) / n,
    }


def _batch(
    producer: RolloutProducer, cfg: GRPOConfig, state: checkpointing.ControllerState, base_cursor: int
) -> tuple[list[Sequence], dict]:
    """Rank 0: the next batch from the producer as sequences, with rollout and async metrics."""
    groups, wait_s = producer.take()
    state.cursor = base_cursor + producer.ctl.head
    seqs = sequences(groups, G.advantages(groups, cfg.algo))
    for s in seqs:
        s.stale = state.weight_version - s.version
    stale = torch.tensor([float(s.stale) for s in seqs])
    timing = [g.timing for g in groups]
    return seqs, {
        **_rollout_metrics(groups),
        **producer.stats(),
        "learner_wait_s": wait_s,
        "generate_s": max(t["gen_end"] for t in timing) - min(t["gen_start"] for t in timing),
        "reward_s": max(t["reward_s"] for t in timing),
        "staleness_max": float(stale.max()),
        "staleness_p50": float(stale.quantile(0.5)),
        "staleness_p99": float(stale.quantile(0.99)),
    }


def _prompt_rows(cursor: int) -> Iterator[dict[str, Any]]:
    """Rank 0's prompts from the restored data cursor, the Ray Data pipeline already started (its
    first row taken and put back), so that its start-up overlaps the wait at the start gate."""
    rows = iter(ray.train.get_dataset_shard("prompts").iter_rows())
    for _ in range(cursor):  # prompts consumed before the checkpoint
        next(rows)
    first = next(rows, None)
    return rows if first is None else itertools.chain([first], rows)


def _producer(
    cfg: GRPOConfig, state: checkpointing.ControllerState, lc: LoopConfig, tok: Any, rows: Iterator[dict[str, Any]]
) -> RolloutProducer:
    """The rollout producer on rank 0, from the restored weight version and ``rows`` (the prompts
    from the data cursor on), not started; with ``agent.env`` set its groups are multi-turn
    episodes on environment actors."""
    from ray import serve

    from raypost.serve.rollout_client import RolloutClient

    controller = RolloutController(
        StalenessAdmission(cfg.async_rl.eta, cfg.algo.prompts_per_step),
        G.dynamic_sampling(cfg.algo),
        version=state.weight_version,
    )
    client = RolloutClient.of(lc.apps["rollout"], lc.channel, cfg.rollout)
    reward = serve.get_app_handle(lc.apps["reward"])
    rollout = None
    if cfg.agent.env is not None:
        from raypost.agents import AgentRollout, EnvPool

        a = cfg.agent
        pool = EnvPool.for_agent(
            a, a.env_options(lc.apps.get("tool"), cfg.data.system_prompt, cfg.data.prompt_template)
        )
        rollout = AgentRollout(client, pool, tok, a, cfg.algo, cfg.rollout.max_model_len).group
    return RolloutProducer(
        controller,
        client,
        reward,
        lambda: next(rows),
        cfg.algo,
        reward_timeout_s=cfg.reward.request_timeout_s,
        stall_s=cfg.rollout.stall_timeout_s,
        rollout=rollout,
    )


def memory_warning(first_gb: float, now_gb: float, warned_gb: float, decay_ms: int) -> str | None:
    """A warning when the learner's resident memory has doubled since its first step and since
    the last warning (``warned_gb``; 0 before any): freed pages kept by jemalloc
    (``resources.jemalloc_decay_ms`` -1) grow it when batch shapes vary, until an OOM kill."""
    if now_gb < 2 * first_gb or now_gb < 2 * warned_gb:
        return None
    fix = (
        "set --resources.jemalloc_decay_ms 60000 (flat memory, a slower learner)"
        if decay_ms < 0
        else "lower resources.jemalloc_decay_ms, or set resources.jemalloc false"
    )
    return f"learner memory grew from {first_gb:.1f} to {now_gb:.1f} GB since its first step: {fix}"


def _throughput(started: float, decay_ms: int) -> Callable[[list[Sequence], dict[str, float], float], dict[str, float]]:
    """Per step: generated tokens per generation second and per step second, the share of the run
    the learner spent waiting for rollouts, and rank 0's resident memory (a warning each time it
    doubles: ``memory_warning``)."""
    import psutil

    waited, rss = [0.0], {"first": 0.0, "warned": 0.0}

    def extra(seqs: list[Sequence], metrics: dict[str, float], step_s: float) -> dict[str, float]:
        tokens, waited[0] = sum(s.sampled_len for s in seqs), waited[0] + metrics["learner_wait_s"]
        now = psutil.Process().memory_info().rss / 2**30  # rank 0's resident memory
        rss["first"] = rss["first"] or now
        warning = memory_warning(rss["first"], now, rss["warned"], decay_ms)
        if warning:
            rss["warned"] = now
            log.warning(warning)
        return {
            "gen_tokens_per_s": tokens / max(metrics["generate_s"], 1e-9),
            "trained_tokens_per_s": tokens / step_s,
            "learner_wait_frac": waited[0] / (time.perf_counter() - started),
            "learner_rss_gb": now,
        }

    return extra


# (cfg, loop config, policy engine, frozen reference or None, tokenizer, restored state) ->
# (``learn`` for the Sampler, more engines to checkpoint by tag)
LearnFactory = Callable[
    [Any, LoopConfig, Any, Any, Any, checkpointing.ControllerState],
    tuple[Callable[[list[Sequence]], dict[str, float]], dict[str, Any]],
]


def _grpo_learn(cfg: GRPOConfig, lc: LoopConfig, engine: Any, ref: Any, tok: Any, state: Any) -> tuple[Any, dict]:
    return (lambda rows: step.learn(engine, ref, rows, cfg, tok.pad_token_id)), {}


def rl_loop(config: dict[str, Any], config_class: type[GRPOConfig], phase: str, make_learn: LearnFactory) -> None:
    """A Ray Train worker of an RL learner on Serve rollouts: GRPO's family, or PPO
    (``make_learn`` adds its critic). ``config["loop"]``: a ``LoopConfig`` with the weight channel."""
    from raypost.models.hf import load_causal_lm

    lc = LoopConfig.of(config)
    cfg = config_class.model_validate(lc.cfg)
    optim = cfg.optim.model_copy(update={"grad_accum": lc.grad_accum})
    rank, world, tok, engine = setup_learner(cfg, lc.model_path, optim, cfg.algo.steps)
    # The frozen reference: on the learner's device, in the learner's precision.
    ref = load_causal_lm(lc.model_path, cfg.deepspeed.precision).to(engine.device).eval() if cfg.algo.beta > 0 else None
    state = checkpointing.restore(engine)
    learn, extra = make_learn(cfg, lc, engine, ref, tok, state)
    rows = _prompt_rows(state.cursor) if rank == 0 else None
    if lc.gate is not None:  # the driver deploys the Serve apps and runs the held-out pass meanwhile
        waited = lc.gate.wait()
        if rank == 0 and waited > 1.0:
            log.info("learner waited %.1fs for the Serve apps and the held-out pass before training", waited)
    producer = _producer(cfg, state, lc, tok, rows) if rows is not None else None
    base_cursor = state.cursor
    sampler = Sampler(
        phase=phase,
        label=phase,
        steps=cfg.algo.steps,
        shown=("reward_mean", "accuracy", "loss", "explained_variance", "gen_tokens_per_s", "staleness_max", "step_s"),
        take=lambda st: _batch(producer, cfg, st, base_cursor),
        learn=learn,
        extra=_throughput(time.perf_counter(), cfg.resources.jemalloc_decay_ms),
        start=lambda: producer.start(),
        advance=lambda v: producer.advance(v),
        stop=lambda: producer.stop(),
    )
    run_steps(cfg, lc, rank, world, engine, tok, state, sampler, extra)


def grpo_loop(config: dict[str, Any]) -> None:
    """Ray Train entry of the GRPO learner."""
    rl_loop(config, GRPOConfig, "grpo", _grpo_learn)
