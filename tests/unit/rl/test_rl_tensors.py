"""Learner tensors of the RL core: collate lines up targets, masks and behaviour log-probs, and
the chunked, selective log-probs equal the full computation's values and gradients."""

from __future__ import annotations

import pytest
import torch

from raypost.rl.records import Sequence
from raypost.rl.tensors import collate, loss_tokens, token_logprobs, trim_to_completions

PAD = 0


# -- collate: targets, masks and behaviour log-probs line up ----------------------------------
def test_collate_aligns_targets_mask_and_behaviour_logprobs():
    short = Sequence(ids=[5, 6, 7, 8, 9], start=3, old=[-0.8, -0.9], sample_id="a#0", adv=1.5, stale=1)
    long = Sequence(
        ids=[5, 6, 10, 11, 12, 13, 14], start=2, old=[-0.1, -0.2, -0.3, -0.4, -0.5], sample_id="b#0", adv=-1.0
    )
    b = collate([short, long], PAD)
    assert b.input_ids.tolist() == [[5, 6, 7, 8, 9, PAD, PAD], [5, 6, 10, 11, 12, 13, 14]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1, 0, 0], [1] * 7]
    # target t is token t+1: the completion tokens 8, 9 sit at target indices 2, 3 (start - 1 ...)
    assert b.targets[0].tolist() == [6, 7, 8, 9, PAD, PAD]
    assert b.mask.tolist() == [[0, 0, 1, 1, 0, 0], [0, 1, 1, 1, 1, 1]]
    assert torch.allclose(b.old_logp, torch.tensor([[0, 0, -0.8, -0.9, 0, 0], [0, -0.1, -0.2, -0.3, -0.4, -0.5]]))
    picked = b.targets[b.mask > 0].tolist()
    assert picked == [8, 9, 10, 11, 12, 13, 14]  # exactly the completions, in order
    assert b.adv.tolist() == [1.5, -1.0]
    assert b.fresh.tolist() == [0.0, 1.0]  # short is one version old; a row of stale 0 is current
    assert loss_tokens([short, long]) == int(b.mask.sum()) == 7


def test_collate_masks_filtered_and_empty_completions_and_truncates_extra_logprobs():
    filtered = Sequence(ids=[5, 6, 7], start=1, old=[-1.0, -2.0], sample_id="a#0", adv=1.0, train=False)
    empty = Sequence(ids=[5, 6], start=2, old=[], sample_id="a#1")
    extra = Sequence(ids=[5, 6, 7, 8], start=3, old=[-0.5, -9.0], sample_id="a#2")  # one log-prob too many
    b = collate([filtered, empty, extra], PAD)
    assert b.mask.tolist() == [[0, 0, 0], [0, 0, 0], [0, 0, 1]]
    assert b.old_logp[2].tolist() == [0, 0, -0.5]
    assert loss_tokens([filtered, empty, extra]) == 1


def test_token_logprobs_reads_the_logits_one_position_before_each_target():
    """Logits at position t put all mass (at temperature 1) on token 3 + t; the targets are
    exactly those tokens, so every log-prob is ~0; shifted by one they would be ~-inf."""
    vocab, t = 8, 4
    logits = torch.full((1, t, vocab), -1e4)
    for pos in range(t):
        logits[0, pos, 3 + pos] = 0.0
    targets = torch.tensor([[3, 4, 5]])
    logp, entropy = token_logprobs(logits, targets, temperature=1.0)
    assert logp.shape == (1, 3) and torch.allclose(logp, torch.zeros(1, 3), atol=1e-4)
    assert torch.allclose(entropy, torch.zeros(1, 3), atol=1e-3)
    wrong, _ = token_logprobs(logits, torch.tensor([[4, 5, 6]]), temperature=1.0)
    assert (wrong < -1e3).all()
    # temperature 2 over two equal logits: log(1/2) each
    flat = torch.zeros(1, 2, 2)
    half, ent = token_logprobs(flat, torch.tensor([[1]]), temperature=2.0)
    assert half.item() == pytest.approx(-0.693147, abs=1e-5) and ent.item() == pytest.approx(0.693147, abs=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_token_logprobs_equal_the_full_log_softmax(temperature):
    """The chunked, selective log-probs (no [N, T, V] log-softmax) give the full computation's
    log-probs, entropy and gradient, with chunks that split rows unevenly (9 positions by 4)."""
    torch.manual_seed(0)
    logits = torch.randn(3, 10, 50, requires_grad=True)
    targets = torch.randint(0, 50, (3, 9))
    weights = torch.randn(3, 9)
    logp, entropy = token_logprobs(logits, targets, temperature, chunk_tokens=4)
    (logp * weights).sum().backward()
    chunked_grad, logits.grad = logits.grad.clone(), None
    full = torch.log_softmax(logits[:, :-1] / temperature, dim=-1)
    want = full.gather(-1, targets[..., None])[..., 0]
    (want * weights).sum().backward()
    assert torch.allclose(logp, want, atol=1e-5)
    assert torch.allclose(entropy, -(full.exp() * full).sum(-1), atol=1e-5)
    assert torch.allclose(chunked_grad, logits.grad, atol=1e-6)
    assert not entropy.requires_grad


def test_logits_of_completion_positions_only_give_the_same_logprobs_and_gradients():
    """``trim_to_completions`` + ``logits_to_keep``: the LM head runs only from the shortest
    prompt's last token on. Log-probs, mask and the gradient of a masked loss equal the full
    forward's; the columns cut hold no completion token."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
    )
    rows = [
        Sequence(ids=list(range(1, 1 + p + c)), start=p, old=[-1.0] * c, sample_id=f"{i}#0", adv=1.0)
        for i, (p, c) in enumerate([(7, 3), (5, 4), (9, 2)])
    ]
    full = collate(rows, pad_id=0)
    trimmed, keep = trim_to_completions(full)
    first = 5 - 1  # the shortest prompt's last token predicts the first completion token
    assert keep == full.input_ids.shape[1] - first and full.mask[:, :first].sum() == 0
    assert torch.equal(trimmed.mask, full.mask[:, first:])
    assert torch.equal(trimmed.input_ids, full.input_ids)
    grads = []
    for b, kwargs in [(full, {}), (trimmed, {"logits_to_keep": keep})]:
        model.zero_grad()
        logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask, **kwargs).logits
        logp, _ = token_logprobs(logits, b.targets, 0.8)
        (logp * b.mask).sum().backward()
        grads.append((logp * b.mask, [p.grad.clone() for p in model.parameters()]))
    assert grads[1][0].shape[1] == keep - 1
    assert torch.allclose(grads[1][0], grads[0][0][:, first:], atol=1e-6)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(grads[0][1], grads[1][1]))
