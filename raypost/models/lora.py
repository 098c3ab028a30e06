"""LoRA adapters folded into the base weights, for pushes to the rollout replicas.

A replica serves plain checkpoint-format weights. The learner trains a peft model, so a push
sends ``W + scale * B @ A`` for every adapted layer, computed beside the training weights
(peft's ``merge_adapter`` would add the delta into them in place and subtract it again,
leaving fp32 rounding in the weights the optimizer keeps training).
"""

from __future__ import annotations

from typing import Any

import torch


def is_peft(module: Any) -> bool:
    return hasattr(module, "get_base_model") and hasattr(module, "merge_and_unload")


def merged_state_dict(peft_model: Any) -> dict[str, torch.Tensor]:
    """The base model's state dict (its own key names) with every active LoRA adapter merged.
    Adapter tensors are left out; the training model is not changed."""
    from peft.tuners.lora import LoraLayer

    base = peft_model.get_base_model()
    deltas: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, layer in base.named_modules():
            if isinstance(layer, LoraLayer) and not layer.merged:
                active = [a for a in layer.active_adapters if a in layer.lora_A]
                if active:
                    deltas[name] = sum(layer.get_delta_weight(a) for a in active)
        out = {}
        for key, value in base.state_dict().items():
            if ".lora_" in key:
                continue
            if "modules_to_save" in key or "original_module" in key:
                raise NotImplementedError(f"{key}: peft modules_to_save are not pushed; train without them")
            plain = key.replace(".base_layer.", ".")
            owner = plain.rsplit(".", 1)[0]
            merged = value + deltas[owner].to(value.dtype) if plain.endswith(".weight") and owner in deltas else value
            out[plain] = merged.detach().clone()
    return out
