"""Every learner optimizes the objective it documents, however the global batch is split.

On real Ray Train workers with DeepSpeed: one step of each learner's own step function over a
global batch of 8 rows whose lengths differ by up to 60x, split as 2 ranks x micro-batch 2 x
accumulation 2 at ZeRO 0, 2 and 3, gives the same gradient (within 1e-5 relative, fp32) as one
pass over the whole batch on one rank. The worker side is tests/equivalence_cases.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.equivalence_cases import CASES, GLOBAL_BATCH

ZEROS = [0, 2, 3]
RTOL = 1e-5


def _fit(model_path: Path, out: Path, world: int, micro: int, zeros: list[int]) -> None:
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    from tests.equivalence_cases import equivalence_loop

    trainer = TorchTrainer(
        equivalence_loop,
        train_loop_config={"model_path": str(model_path), "out_dir": str(out), "zeros": zeros, "micro": micro,
                           "cases": list(CASES)},
        scaling_config=ray.train.ScalingConfig(num_workers=world, resources_per_worker={"CPU": 0.5}),
        run_config=ray.train.RunConfig(name=f"equiv-w{world}", storage_path=str(out / "ray"),
                                       failure_config=ray.train.FailureConfig(max_failures=0)),
        torch_config=TorchConfig(backend="gloo"))
    result = trainer.fit()
    assert result.error is None, result.error


@pytest.fixture(scope="module")
def gradients(ray_cluster, tiny_model, tmp_path_factory) -> Path:
    """Runs both layouts once: the reference (1 rank, the whole batch in one micro-batch) and
    the split one (2 ranks x 2 x 2) at every ZeRO stage."""
    out = tmp_path_factory.mktemp("equiv")
    _fit(tiny_model, out, world=1, micro=GLOBAL_BATCH, zeros=[0])
    _fit(tiny_model, out, world=2, micro=2, zeros=ZEROS)
    return out


def relative_error(split: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> float:
    """||g_split - g_ref|| / ||g_ref|| over every parameter both hold."""
    keys = sorted(set(split) & set(ref))
    assert len(keys) >= len(ref) - 1, f"parameters missing: {sorted(set(ref) - set(split))}"
    diff = torch.cat([(split[k] - ref[k]).flatten() for k in keys])
    norm = torch.cat([ref[k].flatten() for k in keys]).norm()
    assert norm > 0, "the reference step changed no weight: the case trains nothing"
    return float(diff.norm() / norm)


@pytest.mark.slow
@pytest.mark.parametrize("zero", ZEROS)
@pytest.mark.parametrize("case", list(CASES))
def test_split_batch_gives_the_global_gradient(gradients, case, zero):
    ref = torch.load(gradients / f"w1-z0-{case}.pt")
    split = torch.load(gradients / f"w2-z{zero}-{case}.pt")
    err = relative_error(split, ref)
    assert err < RTOL, f"{case} at ZeRO-{zero}: split-batch gradient differs from the global one by {err:.2e}"
