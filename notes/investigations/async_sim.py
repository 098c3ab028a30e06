"""Where async GRPO's speedup comes from: a discrete-event simulation around the real controller.

The simulation drives ``raypost.rl.controller.RolloutController`` (the same admission rule and
batch order the trainer uses) with simulated clocks, so the staleness bound and the waits are
the real policy's. The cluster model:

* N accelerators. Colocated: all N decode, then all N train (sync, eta = 0). Disaggregated:
  r decode, N - r train, concurrently; the best split r is reported.
* A rollout replica decodes up to ``slots`` groups at once (continuous batching); a group takes
  ``length * t_tok`` seconds, lengths drawn from a long-tailed (lognormal) distribution, capped
  at the generation budget. So a synchronous batch waits for its longest group.
* Training a batch takes ``train_work / learners`` seconds, plus ``push_s`` for the weight push.

Inputs default to the phase times measured by benchmarks/async_vs_sync.py on this machine
(benchmarks/RESULTS.md); pass your own for another model or cluster.

    .venv/bin/python -m benchmarks.async_sim [--gpus 8 16 32 64] [--tail-sigma 1.0]

Prints a table and writes benchmarks/out/async_sim.json.
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
from dataclasses import dataclass

from benchmarks.common import OUT, table
from raypost.rl.controller import RolloutController, StalenessAdmission


@dataclass
class Workload:
    batch: int  # groups per step
    steps: int
    mean_len: float  # tokens per group's longest sample
    max_len: float
    tail_sigma: float  # lognormal sigma of lengths (0 = all equal)
    t_tok: float  # seconds per decode step of one replica (batched)
    slots: int  # groups one replica decodes at once
    train_work: float  # seconds to train one batch on one accelerator
    push_s: float


@dataclass
class SimGroup:
    version: int


def _length(w: Workload, rng: random.Random) -> float:
    if w.tail_sigma == 0:
        return w.mean_len
    mu = -(w.tail_sigma**2) / 2  # lognormal with mean 1
    return min(w.max_len, w.mean_len * rng.lognormvariate(mu, w.tail_sigma))


def simulate(w: Workload, eta: int, replicas: int, learners: int, seed: int = 0) -> dict[str, float]:
    """Time to ``w.steps`` steps, learner wait fraction and max staleness."""
    rng, ctl = random.Random(seed), RolloutController(StalenessAdmission(eta, w.batch))
    events: list[tuple[float, int, str, int]] = []  # (time, seq, kind, ticket)
    busy = [0] * replicas
    where: dict[int, int] = {}
    now, seq, steps, learner_busy, waited, idle_since, stale = 0.0, 0, 0, False, 0.0, 0.0, 0
    while steps < w.steps:
        while min(busy) < w.slots and (t := ctl.admit()) is not None:  # keep the replicas full
            r = busy.index(min(busy))
            busy[r], where[t], seq = busy[r] + 1, r, seq + 1
            heapq.heappush(events, (now + _length(w, rng) * w.t_tok, seq, "done", t))
        if not learner_busy and ctl.ready():
            batch = ctl.take()
            stale = max(stale, max(ctl.version - g.version for g in batch))
            waited += now - idle_since
            learner_busy, seq = True, seq + 1
            heapq.heappush(events, (now + w.train_work / learners + w.push_s, seq, "trained", -1))
        now, _, kind, t = heapq.heappop(events)
        if kind == "done":
            busy[where.pop(t)] -= 1
            ctl.complete(t, SimGroup(ctl.running[t]))
        else:
            steps, learner_busy, idle_since = steps + 1, False, now
            ctl.advance(ctl.version + 1)
    return {"time_s": now, "learner_wait_frac": waited / now, "staleness_max": stale}


def colocated_sync(w: Workload, gpus: int) -> dict[str, float]:
    """All accelerators decode, then all train: eta 0 with N replicas and N learners in turn."""
    return simulate(w, 0, gpus, gpus)


def best_split(w: Workload, gpus: int, eta: int) -> tuple[int, dict[str, float]]:
    runs = {r: simulate(w, eta, r, gpus - r) for r in range(1, gpus)}
    r = min(runs, key=lambda k: runs[k]["time_s"])
    return r, runs[r]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, nargs="+", default=[8, 16, 32, 64])
    ap.add_argument("--etas", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--batch", type=int, default=64, help="groups per step")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--mean-len", type=float, default=1000.0)
    ap.add_argument("--max-len", type=float, default=8000.0)
    ap.add_argument("--tail-sigma", type=float, default=1.0)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument(
        "--gen-train-ratio",
        type=float,
        default=None,
        help="rollout work / training work of one batch on one accelerator (default: measured)",
    )
    ap.add_argument("--push-frac", type=float, default=0.02, help="weight push time / one-accelerator train time")
    args = ap.parse_args()
    measured = OUT / "async_vs_sync.json"
    ratio = args.gen_train_ratio
    if ratio is None:
        ph = json.loads(measured.read_text())["results"][0]["phase_means"]
        ratio = ph["generate_s"] / ph["train_s"]
    # Scale: one accelerator decodes a batch in (batch / slots) waves of mean_len steps -> 1.0 s of
    # work per unit; training work is that divided by the ratio.
    t_tok = 1.0 / (args.mean_len * args.batch / args.slots)
    w = Workload(
        args.batch,
        args.steps,
        args.mean_len,
        args.max_len,
        args.tail_sigma,
        t_tok,
        args.slots,
        train_work=1.0 / ratio,
        push_s=args.push_frac / ratio,
    )
    rows, out = [], []
    for n in args.gpus:
        base = colocated_sync(w, n)
        r0, sync_dis = best_split(w, n, 0)
        row = {"gpus": n, "coloc_sync_s": base["time_s"], "disagg_sync_s": sync_dis["time_s"], "disagg_sync_r": r0}
        for eta in args.etas:
            r, res = best_split(w, n, eta)
            row[f"eta{eta}"] = {"rollout_gpus": r, **res, "speedup_vs_coloc": base["time_s"] / res["time_s"]}
        out.append(row)
        rows.append(
            [
                n,
                f"{base['time_s'] / args.steps:.3f}",
                f"{sync_dis['time_s'] / args.steps:.3f} (r={r0})",
                *[
                    f"{row[f'eta{e}']['speedup_vs_coloc']:.2f}x (r={row[f'eta{e}']['rollout_gpus']}, "
                    f"stale<={row[f'eta{e}']['staleness_max']})"
                    for e in args.etas
                ],
            ]
        )
    print(
        table(
            f"simulated step time, gen/train work ratio {ratio:.2f}, lengths lognormal sigma {args.tail_sigma} "
            f"(mean {args.mean_len:.0f}, cap {args.max_len:.0f}), {args.batch} groups/step",
            ["GPUs", "coloc sync s/step", "disagg sync s/step", *[f"eta={e} vs coloc" for e in args.etas]],
            rows,
        )
    )
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "async_sim.json").write_text(
        json.dumps({"args": vars(args), "gen_train_ratio": ratio, "rows": out}, indent=1)
    )


if __name__ == "__main__":
    main()
