"""A learner step under glibc's malloc and under Ray's jemalloc, side by side in one run.

The step is raypost's SFT step as the learner runs it: a DeepSpeed ZeRO-2 engine
(``train.engine.build_engine``), 4 packed rows of 256 tokens with the block-diagonal mask, the
completion-only CE objective, backward and optimizer step. Each variant runs in its own child
process (the allocator is chosen when the process starts):

* glibc: the system malloc. Tensors above its mmap threshold (the logits, activations) are
  returned to the OS when freed, and the next step faults their pages in again.
* jemalloc, default decay: Ray's bundled ``libjemalloc.so`` preloaded, as shipped.
* jemalloc, decay off: the same library with ``MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1``,
  what raypost's learners and teacher pass run with (``raypost.utils.alloc``).

The steps run on a thread other than the main one, as in a Ray Train worker. Reported per
variant: median step seconds (first step left out), user and system CPU seconds per step (the
whole process), and peak RSS.

    .venv/bin/python -m benchmarks.allocator                       # SmolLM2-135M if installed, else the 100M shape
    .venv/bin/python -m benchmarks.allocator --model tiny --steps 6

Prints a table and writes benchmarks/out/allocator.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.common import OUT, model_for, run_child, table

MARK = "ALLOC_BENCH "


def child(model_dir: str, steps: int) -> dict[str, Any]:
    """Time ``steps`` learner steps in this process, on a thread of its own: Ray Train runs the
    training function on one ("TrainingThread"), and glibc gives such a thread its own mmap'd
    arena, which it trims back to the OS more eagerly than the main one."""
    import threading

    out: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: out.update(_steps(model_dir, steps)), name="TrainingThread")
    worker.start()
    worker.join()
    return out


def _steps(model_dir: str, steps: int) -> dict[str, Any]:
    import torch

    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 1000), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0"
    )
    torch.set_num_threads(os.cpu_count() or 1)
    from raypost.config import DeepSpeedConfig, OptimConfig
    from raypost.models.hf import load_causal_lm
    from raypost.train.batches import block_causal_mask
    from raypost.train.engine import build_engine
    from raypost.train.objectives import cross_entropy

    model = load_causal_lm(model_dir)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (4, 256), generator=g)
    seg = torch.cat([torch.full((4, 64), k) for k in (1, 2, 3, 4)], 1)
    labels = ids.clone()
    labels[:, :32] = -100  # each row's first prompt is not supervised
    batch = {"labels": labels, "attention_mask": block_causal_mask(seg)}
    pos = torch.cat([torch.arange(64)] * 4)[None].expand(4, -1)
    engine = build_engine(model, OptimConfig(lr=1e-5, micro_batch_size=4), DeepSpeedConfig(zero_stage=2), steps, 1)
    times, cpu = [], []
    for _ in range(steps):
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        out = engine(input_ids=ids, attention_mask=batch["attention_mask"], position_ids=pos, use_cache=False)
        loss_sum, n, _ = cross_entropy(out.logits, batch)
        engine.backward(loss_sum / n, scale_wrt_gas=False)
        engine.step()
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        times.append(time.perf_counter() - t0)
        cpu.append((r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime))
    return {
        "step_s": times,
        "cpu_s": cpu,
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "jemalloc": "libjemalloc" in Path("/proc/self/maps").read_text(),
    }


def variants() -> dict[str, dict[str, str]]:
    import ray

    lib = str(Path(ray.__file__).parent / "core" / "libjemalloc.so")
    from raypost.utils.alloc import JEMALLOC_CONF

    return {
        "glibc malloc": {"LD_PRELOAD": "", "MALLOC_CONF": ""},
        "jemalloc, default decay": {"LD_PRELOAD": lib, "MALLOC_CONF": ""},
        "jemalloc, decay off (raypost)": {"LD_PRELOAD": lib, "MALLOC_CONF": JEMALLOC_CONF},
    }


def model_dir(name: str) -> tuple[str, Path]:
    if name == "smollm2":
        try:
            from raypost.models import named

            return "smollm2-135m-instruct", Path(named.resolve("smollm2-135m-instruct"))
        except Exception as e:  # noqa: BLE001 - optional package: fall back to the 100M shape
            print(f"SmolLM2 not available ({e}); using the 100M shape")
            name = "100m"
    return name, model_for(name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["smollm2", "100m", "tiny"], default="smollm2")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(MARK + json.dumps(child(args.child, args.steps)), flush=True)
        return
    name, path = model_dir(args.model)
    result: dict[str, Any] = {"model": name, "steps": args.steps, "variants": {}}
    rows = []
    for label, env in variants().items():
        run = run_child(Path(__file__), ["--child", str(path), "--steps", str(args.steps)], env=env, mark=MARK)
        timed = run["step_s"][1:] or run["step_s"]
        cpu = run["cpu_s"][1:] or run["cpu_s"]
        run["median_step_s"] = statistics.median(timed)
        result["variants"][label] = run
        rows.append(
            [
                label,
                f"{run['median_step_s']:.2f}",
                f"{statistics.mean(c[0] for c in cpu):.2f}",
                f"{statistics.mean(c[1] for c in cpu):.2f}",
                f"{run['max_rss_mb']:.0f}",
            ]
        )
    base = result["variants"]["glibc malloc"]["median_step_s"]
    for row, run in zip(rows, result["variants"].values()):
        row.append(f"{base / run['median_step_s']:.2f}")
    print(
        table(
            f"learner step on {name}, 4 x 256 packed tokens, DeepSpeed ZeRO-2, {os.cpu_count()} threads",
            ["allocator", "step s", "user s/step", "system s/step", "peak RSS MB", "speed-up vs glibc"],
            rows,
        )
    )
    OUT.mkdir(exist_ok=True)
    (OUT / "allocator.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
