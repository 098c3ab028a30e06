"""vLLM worker extension: load a pushed weight version in place, through the transport that
sent it (``raypost.weights.channel.engine_tensors`` dispatches on the source's ``transport``).

On CPU, vLLM repacks linear weights, so plain ``model.load_weights`` leaves the packed
layers empty; ``model_runner.reload_weights(..., is_checkpoint_format=True)`` works.
A tied ``lm_head`` keeps the OLD weights after such a reload, so it is re-tied to
``embed_tokens`` and re-processed (without this, half the greedy tokens were wrong).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class WeightReloadExtension:
    """Mixed into vLLM's worker; called through ``collective_rpc('raypost_load', args=(source,))``
    with a weight channel's source (``WeightChannel.fetch``)."""

    def raypost_load(self, source: dict[str, Any]) -> bool:
        import raypost.weights  # noqa: F401 - registers every transport
        from raypost.weights.channel import engine_tensors

        return self._raypost_apply(engine_tensors(source, self))

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
