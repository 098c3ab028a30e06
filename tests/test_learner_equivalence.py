"""Every learner optimizes the objective it documents, however the global batch is split.

On real Ray Train workers with DeepSpeed: one step of each learner's own step function over a
global batch of 8 rows whose lengths differ by up to 60x, split as 2 ranks x micro-batch 2 x
accumulation 2 at ZeRO 0, 2 and 3, gives the same gradient (within 1e-5 relative, fp32) as one
pass over the whole batch on one rank. The harness is benchmarks/learner_equivalence.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.learner_equivalence import CASES, ZEROS, error, run_layouts

RTOL = 1e-5


@pytest.fixture(scope="module")
def gradients(ray_cluster, tiny_model, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("equiv")
    run_layouts(tiny_model, out)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("zero", ZEROS)
@pytest.mark.parametrize("case", list(CASES))
def test_split_batch_gives_the_global_gradient(gradients, case, zero):
    err = error(gradients, case, zero)
    assert err < RTOL, f"{case} at ZeRO-{zero}: split-batch gradient differs from the global one by {err:.2e}"
