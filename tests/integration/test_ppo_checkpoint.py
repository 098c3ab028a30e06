"""PPO's critic resumes exactly: on 2 real ranks (gloo, ZeRO-2, DeepSpeed engines for the policy
and the critic), one PPO step, a checkpoint through ``save_and_report`` with the critic as an
``extra`` engine, then fresh engines restored from it (``restore``, ``restore_extra``). A second
PPO step from the restored pair gives the same policy and critic, to the bit, as from the pair
that never stopped; so the critic's weights, its Adam moments and its schedule all came back. A
fresh critic in its place gives another one (the check can fail)."""

from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path

import pytest
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pair(model_path: str, cfg, world: int):
    import torch

    from raypost.models.hf import load_causal_lm
    from raypost.train.engine import build_engine
    from tests.harness.learner_equivalence import value_model

    accum = {"micro_batch_size": 2, "grad_accum": 2}  # 4 rows a rank: 2 micro-batches, one optimizer step
    torch.manual_seed(0)
    policy = build_engine(load_causal_lm(model_path), cfg.optim.model_copy(update=accum), cfg.deepspeed, 4, world)
    critic = build_engine(value_model(model_path), cfg.critic.optim.model_copy(update=accum), cfg.deepspeed, 4, world)
    return policy, critic


def _weights(engine) -> dict:
    return {k: v.detach().clone() for k, v in engine.module.state_dict().items()}


def _rank(rank: int, world: int, port: int, model_path: str, out: str) -> None:
    import ray.train
    import torch
    import torch.distributed as dist

    from raypost.models.hf import load_tokenizer
    from raypost.train import checkpointing
    from raypost.train.engine import init_distributed
    from raypost.train.steps.ppo import learn
    from tests.harness.learner_equivalence import ppo_config
    from tests.harness.rows import ppo_rows

    env = {"RANK": rank, "LOCAL_RANK": rank, "WORLD_SIZE": world, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
    os.environ.update({k: str(v) for k, v in env.items()})  # as torchrun sets them; DeepSpeed reads LOCAL_RANK
    init_distributed("gloo")
    ckpt_dir = Path(out) / "ckpt"

    def report(metrics, checkpoint):  # as Ray Train does: the ranks' folders merged into one
        shutil.copytree(checkpoint.path, ckpt_dir, dirs_exist_ok=True)

    ray.train.report = report
    try:
        cfg = ppo_config(micro=2, world=world)
        cfg = cfg.model_copy(update={"critic": cfg.critic.model_copy(update={"epochs": 2})})  # the 2nd meets the clip
        tok = load_tokenizer(model_path)
        pad = tok.pad_token_id

        def rows():
            return ppo_rows(tok.vocab_size)[rank::world]

        policy, critic = _pair(model_path, cfg, world)
        learn(policy, critic, None, rows(), cfg, pad, policy_on=True)
        state = checkpointing.ControllerState(step=1, cursor=8, weight_version=1)
        checkpointing.save_and_report(policy, state, {"step": 1}, rank, extra={"critic": critic})
        dist.barrier()

        ray.train.get_checkpoint = lambda: ray.train.Checkpoint(str(ckpt_dir))
        policy2, critic2 = _pair(model_path, cfg, world)
        restored = checkpointing.restore(policy2)
        found = checkpointing.restore_extra(critic2, "critic")
        policy3, fresh = _pair(model_path, cfg, world)  # a critic that was not restored
        for p, c in ((policy, critic), (policy2, critic2), (policy3, fresh)):
            torch.manual_seed(1)
            learn(p, c, None, rows(), cfg, pad, policy_on=True)

        def gap(a, b) -> float:
            wa, wb = _weights(a), _weights(b)
            return max(float((wa[k] - wb[k]).abs().max()) for k in wa)

        if rank == 0:
            result = {
                "state": restored.to_dict(),
                "found": found,
                "policy_gap": gap(policy, policy2),
                "critic_gap": gap(critic, critic2),
                "fresh_critic_gap": gap(critic, fresh),
                "critic_dir": (ckpt_dir / "critic").is_dir(),
            }
            Path(out, "result.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(300)
def test_a_restored_critic_takes_the_same_next_step(tiny_model, tmp_path):
    mp.spawn(_rank, args=(2, _free_port(), str(tiny_model), str(tmp_path)), nprocs=2, join=True)
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["found"] and result["critic_dir"]
    assert result["state"]["step"] == 1 and result["state"]["cursor"] == 8
    assert result["policy_gap"] == 0.0 and result["critic_gap"] == 0.0
    assert result["fresh_critic_gap"] > 1e-4, "a critic that was not restored should step elsewhere"
