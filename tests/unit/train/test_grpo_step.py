"""The GRPO step leaves out the sequences whose loss term is zero (``algo.skip_zero_terms``)
and still gives the gradient of the whole batch. On several ranks under ZeRO 0/2/3 the same
is checked by tests/integration/test_learner_equivalence.py (its split layout skips)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from raypost.config.grpo import GRPOConfig
from raypost.rl.records import Sequence
from raypost.train.steps.grpo import learn, trained_chunks, zero_term
from tests.harness.rows import rl_rows

VOCAB = 64


def _row(i: int, adv: float, train: bool = True) -> Sequence:
    return Sequence(ids=[5, 6, 7, 8], start=2, old=[-1.0, -1.0], sample_id=f"p#{i}", adv=adv, train=train)


def test_zero_terms_are_rows_without_a_gradient():
    assert zero_term(_row(0, 0.0), beta=0.0)
    assert zero_term(_row(0, 0.7, train=False), beta=0.0)  # no token in the loss
    assert not zero_term(_row(0, 0.7), beta=0.0)
    assert not zero_term(_row(0, 0.0), beta=0.05)  # the KL term still trains it
    ppo = _row(0, 0.0)
    ppo.token_adv = [0.0, 0.0]
    assert not zero_term(ppo, beta=0.0)


def test_chunks_keep_the_micro_batch_count_and_size():
    # 10 rows, micro-batch 4: 3 micro-batches (DeepSpeed's accumulation steps) either way
    advs = [0.0, 1.0, 0.0, 0.0, -1.0, 0.5, 0.0, 0.0, 0.0, 2.0]
    rows = [_row(i, a) for i, a in enumerate(advs)]
    chunks, skipped = trained_chunks(rows, 4, beta=0.0)
    assert skipped == 6
    assert [[r.sample_id for r in c] for c in chunks] == [["p#1"], ["p#4"], ["p#5", "p#9"]]
    # every row of the batch trains: the plain split, in order
    full = [_row(i, 1.0) for i in range(10)]
    chunks, skipped = trained_chunks(full, 4, beta=0.0)
    assert skipped == 0 and [len(c) for c in chunks] == [4, 4, 2]
    # nothing trains: each micro-batch still runs (one zero-term row), so the ranks stay in step
    none = [_row(i, 0.0) for i in range(5)]
    chunks, skipped = trained_chunks(none, 2, beta=0.0)
    assert skipped == 5 and len(chunks) == 3 and all(len(c) == 1 and zero_term(c[0], 0.0) for c in chunks)
    # more kept rows than micro-batches: spread evenly, none over the size
    many = [_row(i, float(i % 3 != 0)) for i in range(16)]
    chunks, _ = trained_chunks(many, 4, beta=0.0)
    assert len(chunks) == 4 and max(len(c) for c in chunks) <= 4 and sum(len(c) for c in chunks) == 10


class _Engine:
    """What ``learn`` needs of a DeepSpeed engine, around a plain model (one rank): the
    gradients add up over micro-batches and ``step`` does nothing."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model, self.device, self.dp_world_size, self.backwards = model, torch.device("cpu"), 1, 0

    def __call__(self, **kw: Any) -> Any:
        return self.model(**kw)

    def backward(self, loss: torch.Tensor, scale_wrt_gas: bool = False) -> None:
        self.backwards += 1
        loss.backward()

    def step(self) -> None:
        pass


def _gradient(skip: bool, loss: str, beta: float) -> tuple[torch.Tensor, dict[str, float], int]:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128,
    )  # fmt: skip
    model = Qwen2ForCausalLM(cfg)
    rows = rl_rows(VOCAB)
    for i in (0, 5):  # with row 2's: three groups whose rewards were all equal
        rows[i].adv = 0.0
    conf = GRPOConfig.model_validate(
        {
            "algo": {
                "loss": loss,
                "beta": beta,
                "skip_zero_terms": skip,
                "max_new_tokens": 64,
                "group_size": 4,
                "prompts_per_step": 2,
            },
            "async_rl": {"correction": "none"},
            "optim": {"micro_batch_size": 2},
            "resources": {"num_workers": 1},
        }
    )
    engine = _Engine(model)
    ref = Qwen2ForCausalLM(cfg).eval() if beta > 0 else None
    metrics = learn(engine, ref, rows, conf, pad_id=0)
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]), metrics, engine.backwards


@pytest.mark.parametrize("loss,beta", [("grpo", 0.0), ("dapo", 0.0), ("gspo", 0.0), ("cispo", 0.0), ("grpo", 0.05)])
def test_skipping_zero_terms_gives_the_same_gradient(loss, beta):
    full, m_full, n_full = _gradient(False, loss, beta)
    skip, m_skip, n_skip = _gradient(True, loss, beta)
    assert n_full == n_skip == 4  # 8 rows, micro-batch 2: four backward passes either way
    assert torch.allclose(skip, full, rtol=1e-5, atol=1e-7), float((skip - full).norm() / full.norm())
    assert m_skip["loss"] == pytest.approx(m_full["loss"], rel=1e-5, abs=1e-8)
    # rows 0, 2, 5 (advantage 0) and 7 (no loss token) are left out; with a KL term only row 7
    assert m_skip["skipped_frac"] == (0.125 if beta else 0.5) and m_full["skipped_frac"] == 0.0
