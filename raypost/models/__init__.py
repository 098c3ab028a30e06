"""Models: the offline tiny Qwen2 model, and HF loading/export for real checkpoints."""

from raypost.models.hf import export_hf, load_causal_lm, load_tokenizer
from raypost.models.tiny import CHAT_TEMPLATE, build_tiny_model, train_tokenizer

__all__ = ["export_hf", "load_causal_lm", "load_tokenizer", "CHAT_TEMPLATE", "build_tiny_model", "train_tokenizer"]
