"""vLLM worker extension: load a pushed weight version in place, from a file, a memfd of the
replica's or a process group.

On CPU, vLLM repacks linear weights, so plain ``model.load_weights`` leaves the packed
layers empty; ``model_runner.reload_weights(..., is_checkpoint_format=True)`` works.
A tied ``lm_head`` keeps the OLD weights after such a reload, so it is re-tied to
``embed_tokens`` and re-processed (without this, half the greedy tokens were wrong).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any


def _tensors(path: str) -> Iterator:
    """Each tensor of a pushed file, with the file held until the last is read (the learner
    rewrites an old version's file only when no reader holds it)."""
    from safetensors import safe_open

    from raypost.serve.weights import reading

    with reading(path) as held, safe_open(held, framework="pt") as f:
        for name in f.keys():  # noqa: SIM118 - safe_open is not iterable
            yield name, f.get_tensor(name)


class WeightReloadExtension:
    """Mixed into vLLM's worker; called through ``collective_rpc('raypost_load', args=(source,))``
    with a weight channel's source (``raypost.serve.channel``)."""

    def raypost_load(self, source: dict[str, Any]) -> bool:
        if "file" in source:
            return self._raypost_apply(_tensors(source["file"]))
        if "memfd" in source:
            from raypost.serve.memfd import tensors

            return self._raypost_apply(tensors(source["memfd"]))
        from raypost.serve.collective import receive

        rank = getattr(self, "rank", 0)  # the worker's rank among the replica's engine workers
        device = getattr(self, "device", "cpu") if source["collective"]["backend"] == "nccl" else "cpu"
        return self._raypost_apply(receive(source["collective"], rank, device))

    def _raypost_apply(self, tensors: Iterable) -> bool:
        self.model_runner.reload_weights(weights_iterator=tensors, is_checkpoint_format=True)
        model = self.model_runner.get_model()
        cfg = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
        lm_head, inner = getattr(model, "lm_head", None), getattr(model, "model", None)
        if cfg and lm_head is not None and inner is not None and hasattr(inner, "embed_tokens"):
            lm_head.weight = inner.embed_tokens.weight
            method = getattr(lm_head, "quant_method", None)
            if method is not None and hasattr(method, "process_weights_after_loading"):
                method.process_weights_after_loading(lm_head)
        return True
