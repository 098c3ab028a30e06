"""Async GRPO pieces on hand-built inputs: the controller state machine one transition at a
time, its staleness bound under random completion orders, and the off-policy corrections."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import pytest
import torch

from raypost.algos import OFF_POLICY, POLICY_LOSSES, LossParams
from raypost.algos.offpolicy import current_version_ratio
from raypost.config.grpo import AlgoConfig
from raypost.rl.controller import RolloutController, StalenessAdmission
from raypost.rl.groups import dynamic_sampling


@dataclass
class FakeGroup:  # what the controller needs of a group: its oldest sample version (and rewards)
    version: int
    reward_list: tuple = (0.0, 1.0)

    def rewards(self) -> list[float]:
        return list(self.reward_list)


def ctl(eta: int, batch: int = 2, **kw) -> RolloutController:
    return RolloutController(StalenessAdmission(eta, batch), **kw)


def test_admission_rule_is_areals_formula():
    rule = StalenessAdmission(eta=2, batch=4)
    assert rule.capacity(version=3, accepted=10, running=5) == (2 + 3 + 1) * 4 - 15


def test_eta0_is_the_synchronous_loop():
    c = ctl(eta=0)
    assert [c.admit(), c.admit(), c.admit()] == [0, 1, None]  # one batch, then no capacity
    c.complete(0, FakeGroup(0))
    assert not c.ready()  # half a batch
    c.complete(1, FakeGroup(0))
    assert c.ready() and [g.version for g in c.take()] == [0, 0]
    assert c.admit() is None  # nothing is generated while the learner trains version 0
    c.advance(1)
    assert [c.admit(), c.admit(), c.admit()] == [2, 3, None]


def test_eta1_admits_one_batch_ahead_and_trains_in_ticket_order():
    c = ctl(eta=1)
    assert [c.admit() for _ in range(5)] == [0, 1, 2, 3, None]
    for t in (3, 1, 2):  # out of order; ticket 0 is still running
        c.complete(t, FakeGroup(0, (0.0, 1.0 + t)))
    assert not c.ready()
    c.complete(0, FakeGroup(0, (0.0, 1.0)))
    assert [g.reward_list[1] for g in c.take()] == [1.0, 2.0]  # tickets 0 and 1
    assert c.head == 2 and c.admit() is None
    c.advance(1)
    assert [c.admit(), c.admit(), c.admit()] == [4, 5, None]


@pytest.mark.parametrize("eta", [0, 1, 2])
def test_no_trained_group_is_older_than_eta(eta):
    """Random completion order and learner timing; the group's version is the learner version
    at admission (a replica serves the newest push, so this is the worst case)."""
    rng, batch, steps = random.Random(eta), 3, 40
    c = ctl(eta, batch)
    running: list[int] = []
    trained = 0
    while trained < steps:
        action = rng.random()
        if action < 0.4 and (t := c.admit()) is not None:
            running.append(t)
        elif action < 0.8 and running:
            t = running.pop(rng.randrange(len(running)))
            c.complete(t, FakeGroup(c.running[t]))
        elif c.ready():
            assert all(c.version - g.version <= eta for g in c.take())
            trained += 1
            c.advance(c.version + 1)
    assert c.dropped_stale == 0
    assert len(c.running) + sum(g is not None for g in c.done.values()) <= (eta + 1) * batch


def test_dynamic_sampling_drops_uninformative_groups_within_its_budget():
    algo = AlgoConfig(dynamic_sampling=True, max_refill_rounds=1, prompts_per_step=2)
    c = ctl(eta=0, keep=dynamic_sampling(algo))
    for _ in range(2):
        c.admit()
    assert c.complete(0, FakeGroup(0, (1.0, 1.0))) is False  # all equal: dropped, slot freed
    assert c.admit() == 2
    c.complete(1, FakeGroup(0, (0.0, 1.0)))
    c.complete(2, FakeGroup(0, (0.0, 0.0)))  # dropped (budget 1 x 2 per batch)
    c.admit()
    c.complete(3, FakeGroup(0, (1.0, 1.0)))  # budget spent: kept, advantage 0
    assert c.ready() and [g.reward_list for g in c.take()] == [(0.0, 1.0), (1.0, 1.0)]
    assert c.head == 4 and c.dropped_since_take == 0 and c.dropped_filtered == 2


def test_a_stale_group_is_skipped_and_counted():
    c = ctl(eta=1)
    for _ in range(3):
        c.admit()
    c.advance(5)  # as if the learner moved on (cannot happen under the rule; the check guards it)
    c.complete(0, FakeGroup(0))
    c.complete(1, FakeGroup(5))
    c.complete(2, FakeGroup(4))
    assert c.ready() and [g.version for g in c.take()] == [5, 4]
    assert c.dropped_stale == 1 and c.accepted == 2  # three kept, the stale one given back


def test_resume_starts_with_eta_plus_one_batches_of_capacity():
    c = ctl(eta=1, version=7)
    assert c.capacity() == 2 * 2
    t = c.admit()
    c.withdraw(t)  # the prompt order ran out: the ticket is returned
    assert c.next_ticket == 0 and not c.running


def test_take_before_ready_is_an_error():
    c = ctl(eta=0)
    c.admit()
    with pytest.raises(RuntimeError, match="not complete"):
        c.take()


# -- off-policy corrections (one sequence, two tokens) -------------------------------------------
# current = proximal = [0.5, 0.2]; behaviour = [0.25, 0.4]: weights pi_prox / pi_behav = [2, 0.5].
def corrected_loss(name: str, cap: float = 1.5):
    logp = torch.log(torch.tensor([[0.5, 0.2]])).requires_grad_()
    behav, mask, adv = torch.log(torch.tensor([[0.25, 0.4]])), torch.ones(1, 2), torch.tensor([1.0])
    anchor, w, m, metrics = OFF_POLICY.get_fn(name)(logp, logp.detach(), behav, mask, cap)
    loss, _ = POLICY_LOSSES.get_fn("grpo")(logp, anchor, adv, m, LossParams(), None, w)
    loss.backward()
    return loss.item(), logp.grad[0].tolist(), metrics


def test_truncated_is_by_hand():
    # ratio to pi_prox is 1; weights min([2, .5], 1.5) = [1.5, .5]; sequence mean -(1.5 + .5)/2 = -1
    loss, grad, m = corrected_loss("tis")
    assert loss == pytest.approx(-1.0)
    assert grad == pytest.approx([-0.75, -0.25])  # d/dlogp of -w * ratio, / 2 tokens
    assert m["behav_ratio_mean"] == pytest.approx(1.25) and m["is_capped_frac"] == pytest.approx(0.5)


def test_current_version_ratio_reads_only_the_current_versions_completion_tokens():
    # row 0 (current version): ratios e^0.1, e^-0.1 on its 2 completion tokens; row 1 (one version
    # old) and row 0's prompt token are left out, however far off they are
    logp = torch.tensor([[0.0, -1.0, -2.0], [-1.0, -1.0, -1.0]])
    behav = torch.tensor([[5.0, -1.1, -1.9], [-3.0, -3.0, -3.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    total, n = current_version_ratio(logp, behav, mask, torch.tensor([1.0, 0.0]))
    assert n == 2 and total == pytest.approx(math.exp(0.1) + math.exp(-0.1), rel=1e-6)


def test_decoupled_by_hand():
    # AReaL: token 1's weight 2 > cap 1.5 leaves the loss; token 2: -0.5 over one token
    loss, grad, m = corrected_loss("decoupled")
    assert loss == pytest.approx(-0.5)
    assert grad == pytest.approx([0.0, -0.5])
    assert m["behav_ratio_max"] == pytest.approx(2.0)


def test_no_correction_clips_the_ratio_to_the_behaviour_policy():
    # ratios [2, .5] to pi_behav with adv +1: min(2, 1.2) = 1.2 (clipped), .5 -> -(1.2 + .5)/2
    loss, grad, _ = corrected_loss("none")
    assert loss == pytest.approx(-0.85)
    assert grad == pytest.approx([0.0, -0.25])


def test_corrections_agree_on_policy():
    # behaviour = proximal (synchronous, exact replica parity): every correction is plain GRPO
    logp = torch.log(torch.tensor([[0.5, 0.2]]))
    for name in OFF_POLICY:
        anchor, w, m, metrics = OFF_POLICY.get_fn(name)(logp, logp, logp, torch.ones(1, 2), 2.0)
        assert torch.allclose(w, torch.ones(1, 2)) and metrics["behav_ratio_mean"] == pytest.approx(1.0)
        assert math.isclose(float(torch.exp(logp - anchor).mean()), 1.0)


def test_async_config_errors_name_the_field():
    from raypost.config import ConfigError, load_config
    from raypost.config.grpo import GRPOConfig

    with pytest.raises(ConfigError, match=r"async_rl.eta"):
        load_config(GRPOConfig, ["--async_rl.eta", "-1"])
    with pytest.raises(ConfigError, match=r"async_rl.correction"):
        load_config(GRPOConfig, ["--async_rl.correction", "ppo"])
    with pytest.raises(ConfigError, match=r"did you mean 'async_rl.eta'"):
        load_config(GRPOConfig, ["--async_rl.etta", "1"])
