"""Where the GRPO learner step's time goes on a GPU: step time at ZeRO-0 and ZeRO-2, then
torch.profiler tables (by GPU time and by CPU time) of one ZeRO-2 step, on the batch and shape of
gpu_check's ``learner_mfu`` (Qwen2.5-0.5B shape, 64 sequences, micro-batch 8, bf16).

    python3 benchmarks/gpu_profile.py          # on a GPU machine; torch, transformers, DeepSpeed, pydantic

Its run on one H200 is summarized in benchmarks/RESULTS.md ("GPU: the learners on one H200").
"""

from __future__ import annotations

import statistics
from functools import partial


def main() -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.gpu_learners import _qwen05, _timed, mfu_rows, process_group
    from raypost.config import DeepSpeedConfig
    from raypost.config.grpo import GRPOConfig
    from raypost.train.engine import build_engine
    from raypost.train.steps.grpo import learn

    process_group({"device": "cuda"})
    rows = mfu_rows()
    cfg = GRPOConfig.model_validate(
        {
            "algo": {"beta": 0.0, "group_size": 8, "prompts_per_step": 8, "max_new_tokens": 768},
            "optim": {"micro_batch_size": 8},
        }
    )
    for zero in (0, 2):
        engine = build_engine(
            _qwen05(),
            cfg.optim.model_copy(update={"grad_accum": 8}),
            DeepSpeedConfig(zero_stage=zero, precision="bf16"),
            100,
            1,
        )
        step = partial(learn, engine, None, rows, cfg, 0)
        times = _timed(step, 2, 3, torch.cuda.synchronize)
        print(f"zero{zero} step_s median {statistics.median(times):.3f} {times}", flush=True)
        if zero == 2:
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                step()
                torch.cuda.synchronize()
            for key in ("cuda_time_total", "cpu_time_total"):
                print(prof.key_averages().table(sort_by=key, row_limit=30, max_name_column_width=60), flush=True)
        engine = step = None  # freed before the next stage's engine
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
