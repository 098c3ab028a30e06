"""Distillation losses against hand-derived values: forward and reverse KL, JSD, temperature
and masks, the teacher objective, KD inside packed examples, and the on-policy reverse-KL loss."""

from __future__ import annotations

import math

import pytest
import torch

IGNORE = -100


def _log(*probs: float) -> torch.Tensor:
    return torch.log(torch.tensor([list(probs)]))


def _kd(divergence: str, student_probs, tau: float = 1.0, beta: float = 0.5, mask=(1.0,)):
    from raypost.algos.distill import KDParams, kd_loss

    # Teacher: full-softmax log-probs 0.5 and 0.25 on tokens 0 and 1 (its top-2).
    ids, t_logp = torch.tensor([[0, 1]]), _log(0.5, 0.25)
    n = len(mask)
    return kd_loss(
        _log(*student_probs).repeat(n, 1),
        ids.repeat(n, 1),
        t_logp.repeat(n, 1),
        torch.tensor(mask),
        KDParams(divergence=divergence, beta=beta, temperature=tau),
    )


def test_forward_kl_by_hand():
    # p on the support = (2/3, 1/3); student's full-vocab q = (0.5, 0.25):
    # 2/3 ln((2/3)/0.5) + 1/3 ln((1/3)/0.25) = ln(4/3)
    loss, n, metrics = _kd("forward_kl", (0.5, 0.25, 0.25))
    assert n.item() == 1 and loss.item() == pytest.approx(math.log(4 / 3), abs=1e-6)
    assert metrics["student_mass_on_topk"] == pytest.approx(0.75, abs=1e-6)
    assert metrics["top1_agreement"] == 1.0


def test_reverse_kl_and_jsd_by_hand():
    # Student renormalized on the support: (1/3, 2/3) against p = (2/3, 1/3).
    loss, _, _ = _kd("reverse_kl", (0.25, 0.5, 0.25))
    assert loss.item() == pytest.approx(math.log(2) / 3, abs=1e-6)  # 1/3 ln(1/2) + 2/3 ln 2
    # m = (1/2, 1/2); KL(p||m) = KL(q||m) = 2/3 ln(4/3) + 1/3 ln(2/3).
    loss, _, metrics = _kd("jsd", (0.25, 0.5, 0.25), beta=0.5)
    assert loss.item() == pytest.approx(2 / 3 * math.log(4 / 3) + 1 / 3 * math.log(2 / 3), abs=1e-6)
    assert metrics["top1_agreement"] == 0.0
    # Renormalized student equal to the teacher on the support: no reverse-KL or JSD cost.
    for divergence in ("reverse_kl", "jsd"):
        assert _kd(divergence, (0.5, 0.25, 0.25))[0].item() == pytest.approx(0.0, abs=1e-6)


def test_temperature_and_mask_by_hand():
    # tau = 2: p ∝ sqrt(0.5, 0.25) and q ∝ sqrt(0.5, 0.25, 0.25); on the support p/q = 1.7071/1.2071
    # = sqrt(2) for both tokens, so KL = ln(2)/2 and the tau^2-scaled loss is 2 ln 2.
    loss, _, _ = _kd("forward_kl", (0.5, 0.25, 0.25), tau=2.0)
    assert loss.item() == pytest.approx(2 * math.log(2), abs=1e-5)
    # A masked-out position adds nothing to the sum or the count.
    loss, n, _ = _kd("forward_kl", (0.5, 0.25, 0.25), mask=(1.0, 0.0, 1.0))
    assert n.item() == 2 and loss.item() == pytest.approx(2 * math.log(4 / 3), abs=1e-6)


def test_teacher_objective_shifts_and_mixes_ce():
    from raypost.algos.distill import KDParams
    from raypost.train.objectives import TeacherKD

    # T = 3; only the label at t=1 is supervised, so only the logits at t=0 count.
    logits = torch.zeros(1, 3, 3)
    logits[0, 0] = _log(0.5, 0.25, 0.25)[0]
    logits[0, 1:] = 5.0  # unsupervised positions: any value
    batch = {
        "labels": torch.tensor([[IGNORE, 0, IGNORE]]),
        "teacher_ids": torch.tensor([[[0, 1], [2, 1], [2, 1]]]),
        "teacher_logprobs": _log(0.5, 0.25)[0].expand(1, 3, 2).clone(),
    }
    loss, n, metrics = TeacherKD(KDParams(kd_weight=0.5))(logits, batch)
    # 0.5 * ln(4/3) (forward KL) + 0.5 * (-ln 0.5) (CE of label 0)
    assert n.item() == 1 and loss.item() == pytest.approx(0.5 * math.log(4 / 3) + 0.5 * math.log(2), abs=1e-6)
    assert metrics["ce"] == pytest.approx(math.log(2), abs=1e-6)


def test_kd_on_all_positions_stays_inside_each_packed_example():
    from raypost.algos.distill import KDParams
    from raypost.train.objectives import TeacherKD

    # Two packed examples (segments 1: t=0..2, 2: t=3..4) and one pad (t=5); the labels supervise
    # tokens 2 and 4 (completion: the logits at t=1 and 3). positions="all" fits t=0, 1 (-> 1, 2)
    # and t=3 (-> 4): never from the last token of example 1 into example 2 (t=2), nor into
    # padding (t=4).
    seg = [1, 1, 1, 2, 2, 0]
    logits = torch.full((1, 6, 3), 5.0)  # positions outside the mask: any value
    for t in (0, 1, 3):
        logits[0, t] = _log(0.5, 0.25, 0.25)[0]
    batch = {
        "labels": torch.tensor([[IGNORE, IGNORE, 0, IGNORE, 2, IGNORE]]),
        "segment_ids": torch.tensor([seg]),
        "teacher_ids": torch.tensor([[[0, 1]] * 6]),
        "teacher_logprobs": _log(0.5, 0.25)[0].expand(1, 6, 2).clone(),
    }
    kd = TeacherKD(KDParams(kd_weight=1.0, positions="all"))
    loss, n, _ = kd(logits, batch)
    assert n.item() == 3 and loss.item() == pytest.approx(3 * math.log(4 / 3), abs=1e-5)
    # The learner's normalizer, counted from the rows before any forward pass, is the same 3.
    row = {"labels": batch["labels"][0].tolist(), "segment_ids": seg}
    assert kd.tokens([row]) == 3 and TeacherKD(KDParams()).tokens([row]) == 2


def test_on_policy_reverse_kl_value_and_gradient_by_hand():
    from raypost.algos.distill import on_policy_reverse_kl

    # Two completion tokens (third is padding). Student sampled them with log-probs (-1, -2);
    # the teacher gives (-0.5, -3): advantages (+0.5, -1).
    old = torch.tensor([[-1.0, -2.0, 0.0]])
    teacher = torch.tensor([[-0.5, -3.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    logp = old.clone().requires_grad_(True)
    loss, metrics = on_policy_reverse_kl(logp, old, teacher, mask)
    assert loss.item() == pytest.approx(-(0.5 - 1.0) / 2)  # ratio 1: -mean(A) = 0.25
    assert metrics["reverse_kl"] == pytest.approx(0.25) and metrics["ratio_mean"] == pytest.approx(1.0)
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([-0.25, 0.5, 0.0])  # -A_t / 2
