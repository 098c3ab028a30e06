"""Models: the tiny builder is seeded and idempotent; HF export loads back with equal logits."""

from __future__ import annotations

import pytest
import torch

from raypost.config import TinyModelConfig
from raypost.models.hf import export_hf, load_causal_lm, load_tokenizer
from raypost.models.tiny import build_tiny_model
from tests.conftest import TINY


def test_tiny_build_is_seeded(tmp_path, tiny_model):
    texts = ["Ava has 3 pens.", "3 + 4 = 7\n#### 7"] * 50
    a = build_tiny_model(TinyModelConfig(**TINY), texts, tmp_path / "a")
    b = build_tiny_model(TinyModelConfig(**TINY), texts, tmp_path / "b")
    ma, mb = load_causal_lm(a), load_causal_lm(b)
    for (ka, va), (kb, vb) in zip(ma.state_dict().items(), mb.state_dict().items()):
        assert ka == kb and torch.equal(va, vb)
    cfg = ma.config
    assert cfg.model_type == "qwen2" and cfg.tie_word_embeddings and cfg.hidden_size == TINY["hidden_size"]
    # Idempotent: a second build in the same folder reuses it.
    assert build_tiny_model(TinyModelConfig(**TINY, seed=1), texts, a) == a
    assert torch.equal(load_causal_lm(a).model.embed_tokens.weight, ma.model.embed_tokens.weight)


def test_export_loads_back_with_equal_logits(tmp_path, tiny_model):
    model, tok = load_causal_lm(tiny_model), load_tokenizer(tiny_model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))  # differ from the saved base
    out = export_hf(model, tok, tmp_path / "export")
    back = load_causal_lm(out)
    ids = torch.tensor([tok("Ben has 12 coins. 12 + 3 = 15")["input_ids"]])
    with torch.no_grad():
        assert torch.allclose(model(input_ids=ids).logits, back(input_ids=ids).logits, atol=1e-6)
    assert load_tokenizer(out).chat_template == tok.chat_template


def test_tied_export_stores_embeddings_once(tmp_path, tiny_model):
    from safetensors import safe_open

    model, tok = load_causal_lm(tiny_model), load_tokenizer(tiny_model)
    state = {k: v.clone() for k, v in model.state_dict().items()}  # as DeepSpeed hands it over: both keys
    assert "lm_head.weight" in state
    out = export_hf(model, tok, tmp_path / "tied", state_dict=state)
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert "lm_head.weight" not in f.keys() and "model.embed_tokens.weight" in f.keys()  # noqa: SIM118
    back = load_causal_lm(out)
    assert torch.equal(back.lm_head.weight, back.model.embed_tokens.weight)


def test_lora_trains_adapters_only_and_exports_merged(tmp_path, tiny_model):
    from raypost.config import LoraConfig, ModelConfig
    from raypost.train.engine import prepare_model

    model = prepare_model(str(tiny_model), ModelConfig(lora=LoraConfig(enabled=True, r=4, alpha=8)), "fp32")
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    with torch.no_grad():  # move the adapters off zero so the merge matters
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.add_(0.05)
    ids = torch.tensor([[5, 9, 13, 21, 7]])
    with torch.no_grad():
        want = model(input_ids=ids).logits
    out = export_hf(model, load_tokenizer(tiny_model), tmp_path / "merged")
    back = load_causal_lm(out)
    with torch.no_grad():
        assert torch.allclose(back(input_ids=ids).logits, want, atol=1e-4)
    assert not any("lora" in k for k in back.state_dict())


def test_merged_lora_state_equals_peft_merge_and_leaves_the_training_model_alone(tiny_model):
    """What a LoRA learner pushes to the replicas: every weight equals peft's own
    merge_and_unload (on a copy), under the base model's key names, and the training model
    keeps its adapters and unmerged base weights."""
    import copy

    from raypost.config import LoraConfig, ModelConfig
    from raypost.models.lora import merged_state_dict
    from raypost.train.engine import prepare_model

    model = prepare_model(str(tiny_model), ModelConfig(lora=LoraConfig(enabled=True, r=4, alpha=8)), "fp32")
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    got = merged_state_dict(model)
    want = copy.deepcopy(model).merge_and_unload().state_dict()
    assert set(got) == set(want)
    assert all(torch.allclose(got[k], want[k], atol=1e-6) for k in want)
    changed = [k for k in want if not torch.equal(got[k], load_causal_lm(tiny_model).state_dict()[k])]
    assert changed and all(
        k.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight")) for k in changed
    )
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_grpo_config_refuses_lora_under_zero3():
    from raypost.config import ConfigError, load_config
    from raypost.config.grpo import GRPOConfig

    with pytest.raises(ConfigError, match=r"model.lora.enabled with deepspeed.zero_stage 3.*zero_stage <= 2"):
        load_config(GRPOConfig, ["--model.lora.enabled", "true", "--deepspeed.zero_stage", "3"])


def test_gradient_checkpointing_same_gradients(tiny_model):
    from raypost.config import ModelConfig
    from raypost.train.engine import prepare_model

    ids = torch.tensor([[5, 9, 13, 21, 7, 3]])
    grads = []
    for ckpt in (False, True):
        model = prepare_model(str(tiny_model), ModelConfig(gradient_checkpointing=ckpt), "fp32")
        model.train()
        model(input_ids=ids, labels=ids).loss.backward()
        grads.append(model.model.layers[0].mlp.up_proj.weight.grad.clone())
        assert model.is_gradient_checkpointing == ckpt
    assert torch.allclose(grads[0], grads[1], atol=1e-6)
