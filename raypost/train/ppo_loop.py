"""The PPO learner: GRPO's worker loop (rollouts, rewards, async mode, weight pushes, resume:
``grpo_loop.rl_loop``) with a critic beside the policy on every rank: a value model with its
own DeepSpeed engine, optimizer and schedule, checkpointed with the policy under the tag
``critic``, so a resumed run continues both exactly."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from raypost.config.ppo import PPOConfig
from raypost.rl.records import Sequence
from raypost.train import checkpointing
from raypost.train.engine import build_engine
from raypost.train.grpo_loop import rl_loop
from raypost.train.loop import LoopConfig
from raypost.train.steps import ppo as step

CRITIC_TAG = "critic"


def build_critic(cfg: PPOConfig, lc: LoopConfig, world: int) -> Any:
    """The critic's DeepSpeed engine: ``critic.model_path`` (default: the policy's starting weights)
    as a value model, the policy's micro-batch and accumulation, the critic's own optimizer."""
    from raypost.models.hf import load_value_model

    model = load_value_model(cfg.critic.model_path or lc.model_path, cfg.deepspeed.precision)
    if cfg.model.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    optim = cfg.critic.optim.model_copy(
        update={"grad_accum": lc.grad_accum, "micro_batch_size": cfg.optim.micro_batch_size}
    )
    return build_engine(model, optim, cfg.deepspeed, cfg.algo.steps * cfg.critic.epochs, world)


def _ppo_learn(
    cfg: PPOConfig, lc: LoopConfig, engine: Any, ref: Any, tok: Any, state: checkpointing.ControllerState
) -> tuple[Callable[[list[Sequence]], dict[str, float]], dict[str, Any]]:
    critic = build_critic(cfg, lc, engine.dp_world_size)
    checkpointing.restore_extra(critic, CRITIC_TAG)
    done = [state.step]  # steps trained, for the critic's warm-up

    def learn(rows: list[Sequence]) -> dict[str, float]:
        policy_on = done[0] >= cfg.critic.warmup_steps
        done[0] += 1
        return step.learn(engine, critic, ref, rows, cfg, tok.pad_token_id, policy_on)

    return learn, {CRITIC_TAG: critic}


def ppo_loop(config: dict[str, Any]) -> None:
    """Ray Train entry of the PPO learner."""
    rl_loop(config, PPOConfig, "ppo", _ppo_learn)
