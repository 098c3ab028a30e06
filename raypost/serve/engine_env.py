"""How a vLLM engine runs inside a rollout replica: the CPU engine's process and core binding,
whole-prompt prefill on CPU, and the replica's name for the weight board."""

from __future__ import annotations

import os
from typing import Any

from ray import serve

from raypost.config.serve import RolloutConfig


def cpu_engine_env(cfg: RolloutConfig) -> None:
    """A CPU replica runs vLLM's worker inside its engine-core process: uniproc executor, which
    vLLM keeps on CPU only with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``. That is one spawned process
    (and one vLLM import, ~13 s of CPU) fewer per replica, and generation is as fast
    (benchmarks/RESULTS.md, "vLLM on CPU: one engine process"). vLLM binds OpenMP threads only for
    its multiprocess executor, so the binding (``replica_cores``) is set here through OpenMP's own
    variables, which the engine process inherits."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    # Idle OpenMP threads sleep instead of spinning, so a learner or another replica on the same
    # cores gets them between kernels. benchmarks/omp_wait_policy.py measures it.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, round(cfg.kv_cache_gb))))
    mine = replica_cores(cfg)
    if mine:
        os.environ.update(
            {
                "OMP_NUM_THREADS": str(len(mine)),
                "OMP_PROC_BIND": "true",
                "OMP_PLACES": "{" + ",".join(map(str, mine)) + "}",
            }
        )


def replica_cores(cfg: RolloutConfig) -> list[int] | None:
    """The cores this replica's engine uses: ``VLLM_CPU_OMP_THREADS_BIND`` when set to a core list
    ("0-3,6"; "nobind" = no binding), else with ``cpu_bind`` replica r of R on a node gets cores
    [r*k, (r+1)*k) (vLLM's 'auto' would have put every replica on the same cores), else None."""
    user = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto")
    if user == "nobind":
        return None
    if user != "auto":
        return [c for part in user.split(",") for c in core_range(part)]
    if not cfg.cpu_bind:
        return None
    ctx = serve.get_replica_context()
    cores = sorted(os.sched_getaffinity(0))
    local = ctx.rank.local_rank if ctx.rank is not None else 0
    per = max(1, len(cores) // max(1, ctx.world_size))
    start = (local * per) % len(cores)
    return cores[start : start + per]


def prefill_args(cfg: RolloutConfig) -> dict[str, Any]:
    """On CPU, prompts are prefilled whole: vLLM 0.32 rewinds a seeded request's torch generator
    after a partial (chunked) prefill with ``Generator.set_offset``, which CPU generators do not
    have, and the engine dies ("CPU Generator does not use offset", gpu_model_runner.py
    ``_bookkeeping_sync``). A request with ``seed`` in a batch too big for one prefill step
    killed the replica. Whole prefills need a token budget of at least ``max_model_len``."""
    if cfg.gpus_per_replica:
        return {}
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": max(cfg.max_model_len, 2048)}


def replica_name() -> str:
    """This Serve replica's id (host and pid outside Serve)."""
    try:
        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # noqa: BLE001 - not inside a Serve replica
        import socket

        return f"{socket.gethostname()}:{os.getpid()}"


def core_range(part: str) -> range:
    lo, _, hi = part.strip().partition("-")
    return range(int(lo), int(hi or lo) + 1)
