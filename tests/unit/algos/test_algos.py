"""Advantages, KL estimators and policy losses against values derived by hand."""

from __future__ import annotations

import math

import pytest
import torch

from raypost.algos import ADVANTAGES, KL_ESTIMATORS, POLICY_LOSSES, BatchCounts, LossParams

L = math.log


def test_grpo_advantage_by_hand():
    # mean 0.5; unbiased std = sqrt(4 * 0.25 / 3) = 0.57735 -> +-0.5 / 0.57735 = +-0.866025
    adv = ADVANTAGES.get_fn("grpo")(torch.tensor([[1.0, 0.0, 0.0, 1.0]]))
    assert torch.allclose(adv, torch.tensor([[0.866025, -0.866025, -0.866025, 0.866025]]), atol=1e-5)
    # Dr.GRPO: no std division
    adv = ADVANTAGES.get_fn("grpo")(torch.tensor([[1.0, 0.0, 0.0, 1.0]]), std_normalize=False)
    assert torch.allclose(adv, torch.tensor([[0.5, -0.5, -0.5, 0.5]]))
    # all-equal group: zero advantage, no NaN
    assert torch.equal(ADVANTAGES.get_fn("grpo")(torch.ones(1, 4)), torch.zeros(1, 4))


@pytest.mark.parametrize("name", ["grpo", "rloo", "reinforce_pp"])
def test_all_equal_groups_get_exactly_zero_advantage(name):
    """Eight rewards of 0.1 (format only): float32's mean is not exactly 0.1, and without care the
    rounding error / (std + eps) gave advantages of ~1e-2 that trained on noise."""
    rewards = torch.tensor([[0.1] * 8, [1.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1]])
    adv = ADVANTAGES.get_fn(name)(rewards)
    assert torch.equal(adv[0], torch.zeros(8))
    assert adv[1, 0] > 0 and (adv[1, 1:] < 0).all()


def test_rloo_advantage_by_hand():
    # r=1: 1 - (0+0+1)/3 = 2/3 ; r=0: 0 - (1+0+1)/3 = -2/3
    adv = ADVANTAGES.get_fn("rloo")(torch.tensor([[1.0, 0.0, 0.0, 1.0]]))
    assert torch.allclose(adv, torch.tensor([[2 / 3, -2 / 3, -2 / 3, 2 / 3]]))
    with pytest.raises(ValueError):
        ADVANTAGES.get_fn("rloo")(torch.ones(2, 1))


def test_reinforce_pp_advantage_by_hand():
    # centered [[.5,-.5],[1,-1]]; batch std (unbiased, 4 values) = sqrt(2.5/3) = 0.912871
    adv = ADVANTAGES.get_fn("reinforce_pp")(torch.tensor([[1.0, 0.0], [3.0, 1.0]]))
    s = math.sqrt(2.5 / 3)
    assert torch.allclose(adv, torch.tensor([[0.5 / s, -0.5 / s], [1 / s, -1 / s]]), atol=1e-5)


def test_kl_estimators_by_hand():
    logp, ref = torch.tensor([[L(0.5)]]), torch.tensor([[L(0.25)]])
    assert KL_ESTIMATORS.get_fn("k1")(logp, ref).item() == pytest.approx(L(2))
    assert KL_ESTIMATORS.get_fn("k2")(logp, ref).item() == pytest.approx(0.5 * L(2) ** 2)
    assert KL_ESTIMATORS.get_fn("k3")(logp, ref).item() == pytest.approx(0.5 - 1 + L(2))  # r=1/2: r-1-log r
    same = torch.tensor([[L(0.3)]])
    assert all(KL_ESTIMATORS.get_fn(k)(same, same).item() == 0 for k in ("k1", "k2", "k3"))


def batch():
    """Two sequences. Seq 1: adv +1, ratios [1.5, 0.5], 2 tokens. Seq 2: adv -1, ratios [1, 1.5, 0.5]."""
    old = torch.zeros(2, 3)
    logp = torch.tensor([[L(1.5), L(0.5), 0.0], [0.0, L(1.5), L(0.5)]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    return logp, old, torch.tensor([1.0, -1.0]), mask


def test_grpo_loss_by_hand():
    # eps 0.2. Seq1: min(1.5,1.2)=1.2 (clipped), min(.5,.8)=.5 -> -(1.2+.5)/2 = -0.85
    # Seq2 (adv -1): ratio 1 -> 1; 1.5 -> min(-1.5,-1.2)=-1.5 -> 1.5; .5 -> min(-.5,-.8)=-.8 -> .8
    #   mean (1+1.5+.8)/3 = 1.1. Loss = (-0.85 + 1.1)/2 = 0.125. Clip active on 2 of 5 tokens.
    logp, old, adv, mask = batch()
    loss, m = POLICY_LOSSES.get_fn("grpo")(logp, old, adv, mask, LossParams())
    assert loss.item() == pytest.approx(0.125)
    assert m["clip_frac"] == pytest.approx(0.4)
    loss.backward()
    # clipped token has no gradient; seq1 token2: d(-ratio*adv)/dlogp = -0.5, x 1/2 (seq) x 1/2 (batch)
    assert logp.grad[0, 0].item() == 0.0
    assert logp.grad[0, 1].item() == pytest.approx(-0.125)
    assert logp.grad[0, 2].item() == 0.0  # padding


def test_dapo_loss_by_hand():
    # eps_low .2, eps_high .28, token-level mean over 5 tokens:
    # (-1.28 - 0.5 + 1 + 1.5 + 0.8) / 5 = 0.304
    logp, old, adv, mask = batch()
    loss, _ = POLICY_LOSSES.get_fn("dapo")(logp, old, adv, mask, LossParams(eps_low=0.2, eps_high=0.28))
    assert loss.item() == pytest.approx(0.304)


def test_dr_grpo_loss_by_hand():
    # sums per sequence -1.7 and 3.3, divided by max_tokens 4, mean: (-0.425 + 0.825)/2 = 0.2
    logp, old, adv, mask = batch()
    loss, _ = POLICY_LOSSES.get_fn("dr_grpo")(logp, old, adv, mask, LossParams(max_tokens=4))
    assert loss.item() == pytest.approx(0.2)


def test_gspo_loss_by_hand():
    # Sequence ratios: seq1 exp((L1.5 + L.5)/2) = .75^(1/2) = .8660; seq2 exp((0 + L1.5 + L.5)/3) = .75^(1/3) = .9086.
    # eps .2: both inside the clip range -> loss = (-.8660 + .9086) / 2. Gradient of seq1's tokens:
    # d(-s1)/dlogp_t = -s1/2, x 1/2 (batch) = -.2165 each; padding 0.
    logp, old, adv, mask = batch()
    s1, s2 = 0.75**0.5, 0.75 ** (1 / 3)
    loss, m = POLICY_LOSSES.get_fn("gspo")(logp, old, adv, mask, LossParams())
    assert loss.item() == pytest.approx((-s1 + s2) / 2) and m["clip_frac"] == 0.0
    loss.backward()
    assert logp.grad[0, :2].tolist() == pytest.approx([-s1 / 4] * 2) and logp.grad[0, 2] == 0.0
    assert logp.grad[1].tolist() == pytest.approx([s2 / 6] * 3)  # +s2/3 per token, x 1/2
    # eps .05: seq2 (adv -1) has min(-.9086, -.95) = -.95, the clipped term: no gradient for it.
    logp, old, adv, mask = batch()
    loss, m = POLICY_LOSSES.get_fn("gspo")(logp, old, adv, mask, LossParams(eps_low=0.05, eps_high=0.05))
    assert loss.item() == pytest.approx((-s1 + 0.95) / 2) and m["clip_frac"] == 0.5
    loss.backward()
    assert logp.grad[0, :2].tolist() == pytest.approx([-s1 / 4] * 2) and logp.grad[1].abs().sum() == 0.0


def test_cispo_loss_by_hand():
    # Weights clip(r, .8, 1.2), no gradient: seq1 [1.2, .8] (adv +1), seq2 [1, 1.2, .8] (adv -1).
    # loss = -sum(w * A * logp) / 5 tokens = (-1.2 L1.5 - .8 L.5 + 0 + 1.2 L1.5 + .8 L.5) / 5 = 0, and
    # every token keeps a gradient -w * A / 5, the clipped ones too (GRPO's clipped token has none).
    logp, old, adv, mask = batch()
    loss, m = POLICY_LOSSES.get_fn("cispo")(logp, old, adv, mask, LossParams())
    assert loss.item() == pytest.approx(0.0, abs=1e-7) and m["clip_frac"] == pytest.approx(4 / 5)
    loss.backward()
    assert logp.grad.flatten().tolist() == pytest.approx([-0.24, -0.16, 0.0, 0.2, 0.24, 0.16])
    # A micro-batch of a global batch of 10 tokens: the normalizer is the global one.
    logp, old, adv, mask = batch()
    POLICY_LOSSES.get_fn("cispo")(logp, old, adv, mask, LossParams(), counts=BatchCounts(4, 10))[0].backward()
    assert logp.grad[0, 0].item() == pytest.approx(-0.12)
    # eps_low 1.0 (MiniMax-M1: no lower bound): the .5 ratios keep their weight .5
    logp, old, adv, mask = batch()
    POLICY_LOSSES.get_fn("cispo")(logp, old, adv, mask, LossParams(eps_low=1.0))[0].backward()
    assert logp.grad[0, 1].item() == pytest.approx(-0.5 / 5) and logp.grad[1, 2].item() == pytest.approx(0.5 / 5)


def test_kl_term_inside_the_aggregation():
    # +beta*kl = 0.1*0.5 per token: each sequence mean rises by 0.05 -> 0.125 + 0.05 = 0.175
    logp, old, adv, mask = batch()
    loss, m = POLICY_LOSSES.get_fn("grpo")(logp, old, adv, mask, LossParams(beta=0.1), kl=torch.full((2, 3), 0.5))
    assert loss.item() == pytest.approx(0.175) and m["kl"] == pytest.approx(0.5)


def test_unknown_names_list_known():
    with pytest.raises(KeyError, match="known: cispo, dapo, dr_grpo, grpo, gspo"):
        POLICY_LOSSES.get_fn("ppo2")


def test_micro_batch_shares_add_up_to_the_global_loss_by_hand():
    """Global batch of two sequences, one per micro-batch, at ratio 1 (logp = old_logp):
    sequence A has 1 completion token with advantage +1 (per-token loss -1), B has 3 tokens
    with advantage -1 (+1 each). Over the global batch: DAPO = (-1 + 3) / 4 tokens = 0.5;
    GRPO = mean over sequences of token means = (-1 + 1) / 2 = 0; Dr.GRPO (max_tokens 4) =
    (-1 + 3) / (4 * 2) = 0.25. A per-micro-batch DAPO mean would give (-1 + 1) / 2 = 0."""
    from raypost.algos import BatchCounts

    p = LossParams(max_tokens=4)
    zeros = torch.zeros(1, 3)
    mb_a = (zeros, zeros, torch.tensor([1.0]), torch.tensor([[1.0, 0.0, 0.0]]))
    mb_b = (zeros, zeros, torch.tensor([-1.0]), torch.tensor([[1.0, 1.0, 1.0]]))
    counts = BatchCounts(sequences=2, tokens=4)
    # GSPO at ratio 1 is GRPO's aggregation (CISPO's normalizer: test_cispo_loss_by_hand).
    expected = {"dapo": 0.5, "grpo": 0.0, "dr_grpo": 0.25, "gspo": 0.0}
    for name, want in expected.items():
        fn = POLICY_LOSSES.get_fn(name)
        shares = [fn(*mb, p, counts=counts)[0].item() for mb in (mb_a, mb_b)]
        assert sum(shares) == pytest.approx(want), name
        whole = fn(torch.zeros(2, 3), torch.zeros(2, 3), torch.tensor([1.0, -1.0]), torch.cat([mb_a[3], mb_b[3]]), p)[
            0
        ].item()  # counts=None: the batch is the whole
        assert whole == pytest.approx(want), name
    dapo = POLICY_LOSSES.get_fn("dapo")
    per_mb_mean = (dapo(*mb_a, p)[0] + dapo(*mb_b, p)[0]).item() / 2
    assert per_mb_mean == pytest.approx(0.0)  # what the learner optimized before global counts


def test_bradley_terry_and_on_policy_shares_use_the_global_normalizer():
    from raypost.algos.distill import on_policy_reverse_kl
    from raypost.algos.pairwise import bradley_terry_loss

    # BT at diff 0: -log sigmoid(0) = log 2 per pair; 1 pair of a 4-pair batch -> log(2) / 4
    loss, m = bradley_terry_loss(torch.zeros(1), torch.zeros(1), norm=4.0)
    assert loss.item() == pytest.approx(L(2) / 4) and m["loss"] == pytest.approx(L(2))
    # reverse KL at logp = old: loss = -sum(A * mask) / norm; A = teacher - old = -1 on 2 tokens
    lp = torch.zeros(1, 2)
    loss, _ = on_policy_reverse_kl(lp, lp, -torch.ones(1, 2), torch.ones(1, 2), norm=8.0)
    assert loss.item() == pytest.approx(2 / 8)
