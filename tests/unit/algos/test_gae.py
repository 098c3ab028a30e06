"""PPO's critic side against values derived by hand: terminal rewards, GAE over masked tokens
(observation tokens skipped), whitening, explained variance, the clipped value loss and its
gradient; per-token advantages in the policy losses; the PPO config's checks; and the PPO
step's value pass on a real tiny value model, where a zero value head makes the advantages
the discounted rewards."""

from __future__ import annotations

import math

import pytest
import torch

from raypost.algos import (
    POLICY_LOSSES,
    BatchCounts,
    LossParams,
    Moments,
    explained_variance,
    gae,
    terminal_rewards,
    value_loss,
    whiten,
)
from raypost.config.base import ConfigError, build
from raypost.config.ppo import PPOConfig
from raypost.rl.records import Sequence

# Row 0: a model token, an observation token (mask 0, its value 9 must not matter), two model
# tokens; reward 1. Row 1: two model tokens then padding; reward -1. gamma 0.9, lambda 0.5.
MASK = torch.tensor([[1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]])
VALUES = torch.tensor([[0.5, 9.0, 0.2, -0.1], [0.3, 0.4, 7.0, 7.0]])
REWARD = torch.tensor([1.0, -1.0])


def test_the_reward_lands_on_each_rows_last_masked_token():
    r = terminal_rewards(REWARD, MASK)
    assert r.tolist() == [[0.0, 0.0, 0.0, 1.0], [0.0, -1.0, 0.0, 0.0]]
    assert terminal_rewards(torch.tensor([5.0]), torch.zeros(1, 3)).tolist() == [[0.0, 0.0, 0.0]]


def test_gae_by_hand_skips_observation_tokens():
    # Row 0 over its masked tokens (values 0.5, 0.2, -0.1; rewards 0, 0, 1):
    #   t3: delta = 1 + 0.9 * 0 - (-0.1) = 1.1                    A = 1.1
    #   t2: delta = 0 + 0.9 * (-0.1) - 0.2 = -0.29                A = -0.29 + 0.45 * 1.1 = 0.205
    #   t0: delta = 0 + 0.9 * 0.2 - 0.5 = -0.32                   A = -0.32 + 0.45 * 0.205 = -0.22775
    # Row 1: t1: delta = -1 - 0.4 = -1.4, A = -1.4; t0: delta = 0.9 * 0.4 - 0.3 = 0.06, A = 0.06 - 0.63 = -0.57
    adv, returns = gae(VALUES, terminal_rewards(REWARD, MASK), MASK, gamma=0.9, lam=0.5)
    want = torch.tensor([[-0.22775, 0.0, 0.205, 1.1], [-0.57, -1.4, 0.0, 0.0]])
    assert torch.allclose(adv, want, atol=1e-6)
    assert torch.allclose(returns, (want + VALUES) * MASK, atol=1e-6)


def test_gae_with_gamma_and_lambda_1_is_the_return_less_the_value():
    adv, returns = gae(VALUES, terminal_rewards(REWARD, MASK), MASK, gamma=1.0, lam=1.0)
    assert torch.allclose(adv, (REWARD[:, None] - VALUES) * MASK, atol=1e-6)
    assert torch.allclose(returns, REWARD[:, None] * MASK, atol=1e-6)


def test_whitening_and_explained_variance_by_hand():
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    m = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    mom = Moments.of(x, m)
    assert (mom.n, mom.mean, mom.var) == (3.0, 2.0, pytest.approx(2 / 3))
    assert torch.allclose(whiten(x, m, mom), torch.tensor([[-1.0, 0.0, 1.0, 0.0]]) / (2 / 3) ** 0.5, atol=1e-6)
    returns, values = torch.tensor([[1.0, 2.0, 3.0, 0.0]]), torch.tensor([[1.5, 2.0, 2.5, 0.0]])
    # residuals -0.5, 0, 0.5: variance 1/6 against the returns' 2/3 -> 1 - 1/4
    assert explained_variance(Moments.of(returns - values, m), Moments.of(returns, m)) == pytest.approx(0.75)
    assert math.isnan(explained_variance(Moments.of(returns, m), Moments.of(torch.ones(1, 4), m)))  # constant R


def test_value_loss_by_hand_with_its_clip():
    # token 0: V 1.0, old 0.5, R 2: plain (1-2)^2 = 1, clipped V = 0.5 + 0.2 = 0.7, (0.7-2)^2 = 1.69 -> 1.69
    # token 1: V 0.0, old 0.1, R -1: plain 1, clipped 0.1 - 0.1 = 0.0 -> 1 (a tie)
    # loss = 0.5 * (1.69 + 1) / 4 global tokens = 0.33625
    v = torch.tensor([[1.0, 0.0]], requires_grad=True)
    loss, m = value_loss(
        v, torch.tensor([[0.5, 0.1]]), torch.tensor([[2.0, -1.0]]), torch.ones(1, 2), 0.2, BatchCounts(1, 4)
    )
    assert loss.item() == pytest.approx(0.33625) and m["vf_clip_frac"] == 0.5
    loss.backward()
    # token 0's clipped term is saturated: no gradient; token 1: (V - R) / 4 = 0.25
    assert torch.allclose(v.grad, torch.tensor([[0.0, 0.25]]))


@pytest.mark.parametrize("name", ["grpo", "dapo", "dr_grpo", "cispo"])
def test_a_per_token_advantage_equal_along_each_row_is_the_per_sequence_one(name):
    torch.manual_seed(0)
    logp, old = torch.randn(3, 5, requires_grad=True), torch.randn(3, 5)
    adv, mask = torch.tensor([1.0, -0.5, 2.0]), (torch.rand(3, 5) > 0.3).float()
    fn, p = POLICY_LOSSES.get_fn(name), LossParams(max_tokens=5)
    per_seq, _ = fn(logp, old, adv, mask, p)
    per_token, _ = fn(logp, old, adv[:, None].expand(3, 5), mask, p)
    assert per_token.item() == pytest.approx(per_seq.item())
    varied = adv[:, None] * torch.linspace(0.5, 1.5, 5)
    assert fn(logp, old, varied, mask, p)[0].item() != pytest.approx(per_seq.item())


def test_ppo_config_names_what_does_not_fit():
    with pytest.raises(ConfigError, match="algo.loss 'gspo' takes one advantage per sequence"):
        build(PPOConfig, {"algo": {"loss": "gspo"}})
    with pytest.raises(ConfigError, match="critic.warmup_steps 40 leaves none of algo.steps 40"):
        build(PPOConfig, {"critic": {"warmup_steps": 40}})
    assert build(PPOConfig, {}).run.name == "ppo" and build(PPOConfig, {}).resources.jemalloc_decay_ms == 5000


def test_the_value_pass_of_a_zero_head_gives_the_discounted_rewards(tiny_model):
    from raypost.models.hf import load_value_model
    from raypost.train.steps.ppo import estimate

    critic = load_value_model(str(tiny_model)).eval()
    rows = [
        Sequence(ids=[5, 6, 7, 8, 9], start=2, old=[-1.0] * 3, sample_id="a#0", reward=1.0),
        Sequence(ids=[5, 6, 7, 8], start=1, old=[-1.0] * 3, sample_id="b#0", reward=-2.0, mask=[1, 0, 1]),
    ]
    cfg = build(PPOConfig, {"critic": {"lam": 0.5, "whiten_advantages": False}, "optim": {"micro_batch_size": 2}})
    metrics = estimate(critic, rows, cfg, pad_id=0)
    assert rows[0].values == [0.0, 0.0, 0.0] and rows[0].token_adv == [0.25, 0.5, 1.0]
    assert rows[1].token_adv == [-1.0, 0.0, -2.0]  # the observation token is skipped: 0.5 ** 1, not 0.5 ** 2
    assert rows[0].returns == rows[0].token_adv and metrics["values_mean"] == 0.0
    cfg = build(PPOConfig, {"critic": {"lam": 0.5}, "optim": {"micro_batch_size": 1}})
    estimate(critic, rows, cfg, pad_id=0)
    kept = torch.tensor(rows[0].token_adv + [rows[1].token_adv[0], rows[1].token_adv[2]])
    assert kept.mean().item() == pytest.approx(0.0, abs=1e-6) and kept.var(unbiased=False).item() == pytest.approx(1.0)
