"""Distillation students that share the teacher's tokenizer, built two ways.

- ``from_config``: the teacher's architecture (its config class and every setting but the
  shape) at a smaller shape, seeded random weights. For the offline tiny teacher this is the
  tiny Qwen2 student; for SmolLM2 a small Llama.
- ``pruned``: a copy of the teacher that keeps every k-th decoder layer (layers 0, k, 2k, ...),
  with the teacher's embeddings, final norm and head: the teacher's own weights, a much warmer
  start (DistilBERT's every-other-layer initialization; Minitron's depth pruning).

Both write an HF folder with the teacher's tokenizer and chat template; building is idempotent
(an existing folder is reused, so a resumed run keeps its student).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from raypost.config import TinyModelConfig
from raypost.models.named import resolve


def _decoder_layers(model: Any) -> Any:
    """The ``nn.ModuleList`` of decoder layers of a Llama/Qwen2/Mistral-style causal LM."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ValueError(
            f"cannot prune a {type(model).__name__}: it has no model.layers list of decoder layers "
            f"(Llama, Qwen2, Mistral style); use student.init config"
        )
    return layers


def _save(model: Any, teacher_path: str, out: Path) -> Path:
    """Save ``model`` with the teacher's tokenizer (and chat template), atomically into ``out``."""
    from transformers import AutoTokenizer

    tmp = out.with_name(out.name + ".tmp")
    model.save_pretrained(tmp, safe_serialization=True)
    AutoTokenizer.from_pretrained(resolve(teacher_path)).save_pretrained(tmp)
    tmp.rename(out)
    return out


def from_config(teacher_path: str, shape: TinyModelConfig, out_dir: str | Path) -> Path:
    """The teacher's architecture at ``shape`` (width, depth, heads, MLP; the vocabulary and
    everything else are the teacher's), with seeded random weights."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    out = Path(out_dir)
    if (out / "config.json").is_file():
        return out
    src = resolve(teacher_path)
    config = AutoConfig.from_pretrained(src)
    config.hidden_size, config.num_hidden_layers = shape.hidden_size, shape.num_layers
    config.num_attention_heads, config.num_key_value_heads = shape.num_heads, shape.num_kv_heads
    config.intermediate_size = shape.intermediate_size
    if hasattr(config, "head_dim"):
        config.head_dim = shape.hidden_size // shape.num_heads
    if getattr(config, "layer_types", None) is not None:  # per-layer attention kinds (Qwen2): one per layer
        config.layer_types = [config.layer_types[0]] * shape.num_layers
    torch.manual_seed(shape.seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    try:
        model.generation_config = GenerationConfig.from_pretrained(src)
    except OSError:  # the teacher has none: the model config's defaults stay
        pass
    return _save(model, teacher_path, out)


def kept_layers(num_layers: int, keep_every: int, keep: list[int] | None = None) -> list[int]:
    """Indices of the teacher's layers a pruned student keeps: ``keep`` when given (checked against
    ``num_layers``), else 0, k, 2k, ... below ``num_layers``."""
    if keep is None:
        return list(range(0, num_layers, keep_every))
    if max(keep) >= num_layers:
        raise ValueError(
            f"student.keep_layers names layer {max(keep)}, but the teacher has {num_layers} layers "
            f"(0..{num_layers - 1})"
        )
    return list(keep)


def pruned(teacher_path: str, keep_every: int, out_dir: str | Path, keep: list[int] | None = None) -> Path:
    """A copy of the teacher with the decoder layers ``kept_layers`` names, in order."""
    import torch
    from transformers import AutoModelForCausalLM

    out = Path(out_dir)
    if (out / "config.json").is_file():
        return out
    model = AutoModelForCausalLM.from_pretrained(resolve(teacher_path), dtype=torch.float32)
    layers = _decoder_layers(model)
    keep = kept_layers(len(layers), keep_every, keep)
    if len(keep) == len(layers):
        raise ValueError(
            f"the pruned student keeps all {len(layers)} layers of the teacher; raise "
            f"student.keep_every (2 or more) or list fewer student.keep_layers"
        )
    # Saved and loaded back (layers renumbered by their place in the list) before any use.
    model.model.layers = torch.nn.ModuleList([layers[i] for i in keep])
    model.config.num_hidden_layers = len(keep)
    if getattr(model.config, "layer_types", None) is not None:
        model.config.layer_types = [model.config.layer_types[i] for i in keep]
    return _save(model, teacher_path, out)


def describe(model_path: str | Path) -> dict[str, int]:
    """The shape of a saved model, for the run's report."""
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(resolve(str(model_path)))
    return {
        "hidden_size": c.hidden_size,
        "num_layers": c.num_hidden_layers,
        "num_heads": c.num_attention_heads,
        "num_kv_heads": getattr(c, "num_key_value_heads", c.num_attention_heads),
        "intermediate_size": c.intermediate_size,
        "vocab_size": c.vocab_size,
    }
