"""jemalloc for the processes that allocate large tensors every step (learners, the teacher pass).

With glibc's malloc, the memory of a step's large tensors (logits of a 49k-token vocabulary,
activations) goes back to the OS when they are freed, and the next step faults it in again; Ray
Train runs the training function on a thread of its own, whose glibc arena is trimmed eagerly.
On the SmolLM2 student here that was a third of a learner step. Ray's wheel ships a jemalloc;
preloaded with decay off, freed pages stay with the process for the next step
(benchmarks/RESULTS.md, "jemalloc"). A process then holds what it freed until it exits: its peak
when every step allocates the same shapes, and more and more when they vary (multi-turn episodes:
a SmolLM2 learner grew 0.8-1.5 GB a step to 14 GB and out of memory; GRPO on a sparse reward, whose skipped rows
vary its micro-batches in rows and lengths: 0.05-0.17 GB a step, an OOM kill at step 81), where a finite decay
(``resources.jemalloc_decay_ms``; GRPO's default 60 s, PPO's 5 s) keeps it flat.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

JEMALLOC_CONF = "dirty_decay_ms:-1,muzzy_decay_ms:-1"


def jemalloc_env(enabled: bool = True, decay_ms: int = -1) -> dict[str, Any]:
    """A Ray runtime env that preloads Ray's own jemalloc (``{}`` when off or not shipped), freed
    pages going back to the OS after ``decay_ms`` (-1: never). A ``LD_PRELOAD`` or ``MALLOC_CONF``
    already set in this process is kept."""
    import ray

    lib = Path(ray.__file__).parent / "core" / "libjemalloc.so"
    if not enabled or not lib.is_file():
        return {}
    preload = " ".join(x for x in (str(lib), os.environ.get("LD_PRELOAD", "")) if x)
    conf = JEMALLOC_CONF.replace("-1", str(decay_ms))
    return {"env_vars": {"LD_PRELOAD": preload, "MALLOC_CONF": os.environ.get("MALLOC_CONF", conf)}}
