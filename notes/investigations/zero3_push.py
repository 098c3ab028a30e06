"""ZeRO-3 weight push: rank 0's peak memory and time, streamed in buckets against a whole-model gather.

Two Ray Train workers hold the model under ZeRO-3 (gloo, fp32) and push it once through the shm
channel, each way in a fresh worker group, side by side in one run:

* consolidated: DeepSpeed's ``_zero3_consolidated_16bit_state_dict()`` gathers the whole model
  into rank 0, and the channel writes that dict (how raypost pushed before issue 21's streaming).
* streamed: ``raypost.train.sync.push_weights``: both ranks gather ``--bucket-mb`` at a time
  (``GatheredParameters``) and rank 0 writes each bucket into the file as it comes.

The peak is rank 0's anonymous resident memory (``RssAnon``, sampled every millisecond by a
thread) above its level just before the push; the file the push writes lies in /dev/shm and is
not in it. Both ways write the same tensors (checked).

    .venv/bin/python -m notes.investigations.zero3_push                              # SmolLM2 (if installed), else tiny
    .venv/bin/python -m notes.investigations.zero3_push --model tiny --bucket-mb 1

Prints a table and writes benchmarks/out/zero3_push.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.common import OUT, model_for, table


def rss_anon_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


class PeakSampler:
    """The highest RssAnon of this process while the ``with`` block runs, in MB above its start."""

    def __enter__(self) -> PeakSampler:
        self.start = self.peak = rss_anon_mb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, rss_anon_mb())

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_anon_mb())
        self.above_mb = self.peak - self.start


def shm_channel(weights_dir: Path) -> Any:
    """The shm channel whose files go to ``weights_dir``."""
    from raypost.config.weights import ShmWeights
    from raypost.weights.shm import ShmChannel

    return ShmChannel(ShmWeights(dir=str(weights_dir.parent)), weights_dir.name)


def push_once(config: dict[str, Any]) -> None:
    """Ray Train entry: build the ZeRO-3 engine, push once the configured way, report from rank 0."""
    import deepspeed
    import ray.train
    import torch

    from raypost.config import DeepSpeedConfig, OptimConfig
    from raypost.models.hf import load_causal_lm
    from raypost.train.collectives import barrier
    from raypost.train.engine import deepspeed_config, init_distributed
    from raypost.train.sync import push_weights

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    torch.set_num_threads(1)
    init_distributed("gloo")
    model = load_causal_lm(config["model"])
    model_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    ds = deepspeed_config(DeepSpeedConfig(zero_stage=3), OptimConfig(micro_batch_size=1), world)
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.0), config=ds)
    del model
    chan = shm_channel(Path(config["weights_dir"]))
    barrier()
    with PeakSampler() as peak:
        t0 = time.perf_counter()
        if config["way"] == "streamed":
            push_weights(engine, 3, 1, chan, rank, config["bucket_mb"])
        else:
            state = engine._zero3_consolidated_16bit_state_dict()
            if rank == 0:
                tied = engine.module.config.tie_word_embeddings
                chan.publish(1, {k: v for k, v in state.items() if not (tied and k == "lm_head.weight")})
            del state
            barrier()
        seconds = time.perf_counter() - t0
    if rank == 0:
        Path(config["report"]).write_text(
            json.dumps({"way": config["way"], "push_s": seconds, "peak_above_mb": peak.above_mb, "model_mb": model_mb})
        )


def run_way(model: Path, way: str, bucket_mb: int, work: Path) -> dict[str, Any]:
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    weights_dir = Path(f"/dev/shm/raypost-zero3-push-{work.name}-{way}")
    report = work / f"{way}.json"
    trainer = TorchTrainer(
        push_once,
        train_loop_config={
            "model": str(model),
            "way": way,
            "bucket_mb": bucket_mb,
            "weights_dir": str(weights_dir),
            "report": str(report),
        },
        scaling_config=ray.train.ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
        run_config=ray.train.RunConfig(
            name=f"zero3-push-{way}",
            storage_path=str(work / "ray"),
            failure_config=ray.train.FailureConfig(max_failures=0),
        ),
        torch_config=TorchConfig(backend="gloo"),
    )
    result = trainer.fit()
    if result.error is not None:
        raise result.error
    from safetensors.torch import load_file

    out = json.loads(report.read_text())
    out["weights"] = load_file(str(weights_dir / "v1.safetensors"))
    shm_channel(weights_dir).close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct", help="smollm2-135m-instruct (if installed) or tiny")
    ap.add_argument("--bucket-mb", type=int, default=64)
    ap.add_argument("--out", default=str(OUT / "zero3_push.json"))
    args = ap.parse_args()
    import ray

    from raypost.models import named

    try:
        model = Path(named.resolve(args.model)) if args.model != "tiny" else model_for("tiny")
    except Exception as err:  # noqa: BLE001 - the wheel is optional
        print(f"{args.model} not available ({err}); using the tiny model")
        model, args.model = model_for("tiny"), "tiny"
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        with tempfile.TemporaryDirectory(prefix="zero3-push-") as tmp:
            rows = [run_way(model, way, args.bucket_mb, Path(tmp)) for way in ("consolidated", "streamed")]
    finally:
        ray.shutdown()
    import torch

    a, b = rows[0].pop("weights"), rows[1].pop("weights")
    same = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    if not same:
        raise AssertionError("the streamed push wrote other weights than the consolidated one")
    for r in rows:
        r["peak_of_model"] = r["peak_above_mb"] / r["model_mb"]
    result = {
        "model": args.model,
        "bucket_mb": args.bucket_mb,
        "workers": 2,
        "same_weights": same,
        "rows": rows,
        "peak_ratio": rows[0]["peak_above_mb"] / max(rows[1]["peak_above_mb"], 1e-9),
    }
    print(
        table(
            f"ZeRO-3 push, 2 workers, {args.model}",
            ["way", "push s", "rank-0 peak above start (MB)", "of the model"],
            [[r["way"], f"{r['push_s']:.2f}", f"{r['peak_above_mb']:.0f}", f"{r['peak_of_model']:.2f}x"] for r in rows],
        )
    )
    print(
        f"model {rows[0]['model_mb']:.0f} MB fp32, {args.bucket_mb} MiB buckets; consolidated / streamed peak: "
        f"{result['peak_ratio']:.1f}x"
    )
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
