"""SFT on a real Ray cluster with DeepSpeed: ZeRO-3 on 2 workers, and the HF export equal to
DeepSpeed's own consolidation. Exact resume (ZeRO-2, 2 workers) after the driver is killed, on a
machine without the run's files, is in tests/integration/test_storage.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import TINY, run_pipeline


def small_args(run_dir: Path, name: str, zero: int, steps: int, every: int, tiny: bool = True) -> list[str]:
    args = [
        "--run.storage_path",
        str(run_dir),
        "--run.name",
        name,
        "--deepspeed.zero_stage",
        str(zero),
        "--train.max_steps",
        str(steps),
        "--run.checkpoint_every",
        str(every),
        "--run.log_every",
        "1",
        "--data.synthetic.num_train",
        "400",
        "--data.synthetic.num_eval",
        "16",
        "--data.max_seq_len",
        "96",
        "--optim.micro_batch_size",
        "4",
        "--optim.lr",
        "3e-3",
        "--eval.max_new_tokens",
        "12",
        "--train.epochs",
        "1",
        "--resources.num_workers",
        "2",
        "--resources.cpus_per_worker",
        "0.5",
    ]
    for key, value in TINY.items() if tiny else ():
        args += [f"--model.tiny.{key}", str(value)]
    return args


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@pytest.mark.slow
@pytest.mark.parametrize("zero", [3])  # ZeRO-2: the storage test's resume runs it; its gradient, the equivalence test
def test_sft_zero_two_workers(ray_cluster, tmp_path, zero):
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    from raypost.models.hf import load_causal_lm

    # Without the eval-loss pass (train.eval_loss false): held-out accuracy is still reported.
    run_pipeline(
        "sft.py", [*small_args(tmp_path, f"z{zero}", zero, steps=8, every=8), "--train.eval_loss", "false"], ray_cluster
    )
    run = tmp_path / f"z{zero}"
    report = json.loads((run / "report.json").read_text())
    assert report["steps"] == 8 and report["heldout_n"] == 16 and 0.0 <= report["heldout_accuracy"] <= 1.0
    assert report["data"]["train"]["kept"] == 400 and (run / "loss.png").stat().st_size > 1000
    assert list((run / "wandb").glob("offline-run-*")), "wandb should log offline into the run folder"
    losses = [r["loss"] for r in read_jsonl(run / "metrics.jsonl") if "loss" in r]
    assert len(losses) == 8 and losses[-1] < losses[0]
    assert not any("eval_loss" in r for r in read_jsonl(run / "metrics.jsonl"))
    # The exported HF model holds exactly the weights DeepSpeed checkpointed (ZeRO-3: gathered).
    ckpt = Path(report["model_path"]).parent
    ds_state = get_fp32_state_dict_from_zero_checkpoint(str(ckpt), tag="ds")
    exported = load_causal_lm(report["model_path"]).state_dict()
    for name, tensor in ds_state.items():
        assert torch.allclose(exported[name], tensor.float(), atol=1e-6), name
