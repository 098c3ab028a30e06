"""Load any HF causal LM / tokenizer by id, path or raypost name (models.named), and export
checkpoints in HF format."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from raypost.models.named import resolve

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def load_tokenizer(path: str | Path) -> Any:
    """AutoTokenizer with a pad token (falls back to EOS, as TRL does)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve(path))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_causal_lm(path: str | Path, precision: str = "fp32") -> Any:
    """AutoModelForCausalLM in the given precision, SDPA attention."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(resolve(path), dtype=DTYPES[precision], attn_implementation="sdpa")


def load_sequence_classifier(path: str | Path, precision: str = "fp32") -> Any:
    """AutoModelForSequenceClassification with one output (a reward model's score head)."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(resolve(path), num_labels=1, dtype=DTYPES[precision])
    tok = load_tokenizer(path)
    model.config.pad_token_id = tok.pad_token_id
    return model


def load_value_model(path: str | Path, precision: str = "fp32") -> Any:
    """AutoModelForTokenClassification with one output: a value per position (PPO's critic). The
    backbone loads from a causal LM or a reward model; the value head starts at 0, so the first
    values are 0 and the first advantages are the discounted rewards."""
    from transformers import AutoConfig, AutoModelForTokenClassification

    config = AutoConfig.from_pretrained(resolve(path), num_labels=1)
    config.classifier_dropout = 0.0  # transformers' default is 0.1: noisy values, split-dependent gradients
    model = AutoModelForTokenClassification.from_pretrained(resolve(path), config=config, dtype=DTYPES[precision])
    model.config.pad_token_id = load_tokenizer(path).pad_token_id
    torch.nn.init.zeros_(model.score.weight)
    if model.score.bias is not None:
        torch.nn.init.zeros_(model.score.bias)
    return model


def export_hf(model: Any, tokenizer: Any, out_dir: str | Path, state_dict: dict | None = None) -> Path:
    """Save ``model`` (merged if it is a peft model) and ``tokenizer`` as an HF folder that
    transformers and vLLM load. ``state_dict`` overrides the weights (ZeRO-3 gathered)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    if state_dict is not None and getattr(model.config, "tie_word_embeddings", False):
        # Save tied weights once, as HF does. A redundant lm_head.weight in the file made vLLM
        # (CPU) replicas started from it ignore later in-place reloads of the embeddings.
        state_dict = {k: v for k, v in state_dict.items() if k != "lm_head.weight"}
    model.save_pretrained(out, state_dict=state_dict, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out
