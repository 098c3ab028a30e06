"""DPO and its variants: the losses against values derived by hand, the learner step's global
normalization (a batch split into micro-batches gives one pass's gradient), pair tokenization and
the config's checks. On a real Ray cluster: tests/e2e/test_dpo.py."""

from __future__ import annotations

import math

import pytest
import torch

# Two pairs. Pair 0 is worked in the comments: beta 0.5; policy chosen/rejected log-probs -2, -4,
# reference -3, -3.5; lengths 2 and 4. Pair 1 is pair 0 with chosen and rejected swapped.
POLICY = ([-2.0, -4.0], [-4.0, -2.0])
REF = ([-3.0, -3.5], [-3.5, -3.0])
LENS = ([2.0, 4.0], [4.0, 2.0])


def logps(values: tuple[list[float], list[float]], grad: bool = False):
    from raypost.algos.preference import PairLogps

    c = torch.tensor(values[0], requires_grad=grad)
    r = torch.tensor(values[1], requires_grad=grad)
    return PairLogps(c, r, torch.tensor(LENS[0]), torch.tensor(LENS[1]))


def loss(name: str, norm: float = 2.0, **params):
    from raypost.algos import PREFERENCE_LOSSES
    from raypost.algos.preference import PreferenceParams

    policy = logps(POLICY, grad=True)
    out = PREFERENCE_LOSSES.get_fn(name)(policy, logps(REF), PreferenceParams(beta=0.5, **params), norm)
    return (*out, policy)


EMPTY = {"kind": "", "reject": "", "raw": ""}


def softplus(x: float) -> float:
    return math.log1p(math.exp(x))


def test_sigmoid_dpo_by_hand():
    # Pair 0: implicit rewards 0.5 * (-2 + 3) = 0.5 and 0.5 * (-4 + 3.5) = -0.25, z = 0.75:
    # -log sigmoid(0.75) = softplus(-0.75). Pair 1 (swapped): z = -0.75.
    total, m, policy = loss("sigmoid", norm=4.0)
    assert total.item() == pytest.approx((softplus(-0.75) + softplus(0.75)) / 4, abs=1e-6)
    assert m["reward_accuracy"] == 0.5 and m["reward_margin"] == pytest.approx(0.0, abs=1e-7)
    assert m["reward_chosen"] == pytest.approx((0.5 + -0.25) / 2)
    total.backward()
    # d/d(pi_w) of pair 0: -beta * (1 - sigmoid(0.75)) / norm
    assert policy.chosen.grad[0].item() == pytest.approx(-0.5 * (1 - 1 / (1 + math.exp(-0.75))) / 4, abs=1e-6)


def test_label_smoothing_mixes_in_the_flipped_label():
    # eps 0.2: 0.8 softplus(-z) + 0.2 softplus(z), z = 0.75 and -0.75.
    total, _, _ = loss("sigmoid", label_smoothing=0.2)
    want = (0.8 * softplus(-0.75) + 0.2 * softplus(0.75)) + (0.8 * softplus(0.75) + 0.2 * softplus(-0.75))
    assert total.item() == pytest.approx(want / 2, abs=1e-6)


def test_ipo_by_hand():
    # Pair 0: h = (-2 + 3) / 2 - (-4 + 3.5) / 4 = 0.625; target 1 / (2 * 0.5) = 1: (0.625 - 1)^2.
    # Pair 1 (lengths 4 and 2): h = (-4 + 3.5) / 4 - (-2 + 3) / 2 = -0.625: (-0.625 - 1)^2.
    total, _, _ = loss("ipo")
    assert total.item() == pytest.approx((0.140625 + 2.640625) / 2, abs=1e-6)


def test_simpo_by_hand_needs_no_reference():
    from raypost.algos import PREFERENCE_LOSSES
    from raypost.algos.preference import PreferenceParams

    # Pair 0: 0.5 * (-2 / 2) - 0.5 * (-4 / 4) - gamma 0.5 = -0.5 -> softplus(0.5).
    # Pair 1: 0.5 * (-4 / 4) - 0.5 * (-2 / 2) - 0.5 = -0.5 -> softplus(0.5).
    out, m = PREFERENCE_LOSSES.get_fn("simpo")(logps(POLICY), None, PreferenceParams(beta=0.5, simpo_gamma=0.5), 2)
    assert out.item() == pytest.approx(softplus(0.5), abs=1e-6) and m["reward_margin"] == pytest.approx(0.0)


@pytest.mark.parametrize("name", ["sigmoid", "ipo", "simpo"])
def test_rpo_adds_the_chosen_responses_per_token_nll(name):
    # Chosen log-probs -2 over 2 tokens and -4 over 4: NLL 1.0 per token in both pairs. Weight 0.5
    # adds 0.5 * (1 + 1) / norm 2 = 0.5 to the loss, and -0.5 / (2 * 2) to d/d(pi_w) of pair 0.
    base, _, p0 = loss(name)
    rpo, m, p1 = loss(name, nll_weight=0.5)
    assert rpo.item() == pytest.approx(base.item() + 0.5, abs=1e-6) and m["nll_chosen"] == pytest.approx(1.0)
    base.backward()
    rpo.backward()
    assert p1.chosen.grad[0].item() - p0.chosen.grad[0].item() == pytest.approx(-0.5 / 4, abs=1e-6)
    assert p1.rejected.grad.tolist() == pytest.approx(p0.rejected.grad.tolist(), abs=1e-7)


def test_config_checks_name_the_field():
    from raypost.config import ConfigError, load_config
    from raypost.config.dpo import DPOConfig

    with pytest.raises(ConfigError, match="dpo.label_smoothing applies to dpo.loss=sigmoid only"):
        load_config(DPOConfig, ["--dpo.loss", "ipo", "--dpo.label_smoothing", "0.1"])
    with pytest.raises(ConfigError, match="did you mean 'dpo.beta'"):
        load_config(DPOConfig, ["--dpo.betta", "0.2"])


def test_pairs_are_templated_prompts_and_eos_closed_responses(tiny_model):
    import pandas as pd

    from raypost.data.preference import TokenizeChatPairs
    from raypost.data.tokenize import completion_ids, prompt_ids
    from raypost.models.hf import load_tokenizer

    tok = load_tokenizer(str(tiny_model))
    batch = pd.DataFrame(
        [
            {
                "id": "a",
                "prompt": "2 + 3?",
                "chosen": "5 #### 5",
                "rejected": "6 #### 6",
                "kind": "",
                "reject": "",
                "raw": "",
            },
            {"id": "b", "prompt": "1 + 1?", "chosen": "2 " * 300, "rejected": "3", "kind": "", "reject": "", "raw": ""},
        ]
    )
    out = TokenizeChatPairs(str(tiny_model), 128, None, "{question}")(batch)
    assert list(out["prompt_ids"][0]) == prompt_ids(tok, "2 + 3?", None)
    assert (
        list(out["chosen_ids"][0]) == completion_ids(tok, "5 #### 5") and out["chosen_ids"][0][-1] == tok.eos_token_id
    )
    assert (
        out["reject"][0] == ""
        and out["reject"][1].startswith("too long:")
        and "data.max_seq_len 128" in out["reject"][1]
    )


class Engine:
    """The part of a DeepSpeed engine ``loss_on`` calls: the forward and the device."""

    def __init__(self, model) -> None:
        self.model, self.device = model, "cpu"

    def __call__(self, **kwargs):
        return self.model(**kwargs)


def test_a_batch_split_into_micro_batches_gives_one_passs_gradient(tiny_model):
    """The step's loss is normalized over the global batch: 4 pairs in micro-batches of 1 give the
    gradient of one pass over all 4 (one rank; ranks add through the same all_sum)."""
    from raypost.config.dpo import DPOConfig
    from raypost.models.hf import load_causal_lm, load_tokenizer
    from raypost.train.steps import dpo as step

    tok = load_tokenizer(str(tiny_model))
    rows = [
        {
            "id": str(i),
            "prompt_ids": tok(f"q{i}")["input_ids"],
            "chosen_ids": tok(f"yes {i}")["input_ids"],
            "rejected_ids": tok(f"no no {i}")["input_ids"],
        }
        for i in range(4)
    ]
    torch.manual_seed(0)
    policy, ref = load_causal_lm(str(tiny_model)), load_causal_lm(str(tiny_model))
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.01 * torch.randn_like(p))  # policy != reference: the loss has a gradient
    grads = []
    for micro in (4, 1):
        cfg = DPOConfig.model_validate({"optim": {"micro_batch_size": micro}})
        policy.zero_grad()
        for mb in [rows[i : i + micro] for i in range(0, 4, micro)]:
            share, _ = step.loss_on(Engine(policy), ref, mb, cfg, tok.pad_token_id, 4.0)
            share.backward()
        grads.append([p.grad.clone() for p in policy.parameters()])
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*grads))
