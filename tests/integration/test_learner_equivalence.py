"""Every learner optimizes the objective it documents, however the global batch is split.

On real Ray Train workers with DeepSpeed: one step of each learner's own step function over a
global batch of 8 rows whose lengths differ by up to 60x, split as 2 ranks x micro-batch 2 x
accumulation 2 at ZeRO 0, 2 and 3, gives the same gradient (within 1e-5 relative, fp32) as one
pass over the whole batch on one rank. The harness is tests/harness/learner_equivalence.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.learner_equivalence import CASES, ZEROS, error, run_layouts

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


def test_deepspeeds_built_op_is_kept_in_this_venv(monkeypatch):
    """DeepSpeed's JIT-built shm allreduce op goes to the venv's own torch extension cache (where
    ``make setup`` prebuilds it), not the per-user one another venv's build would overwrite."""
    import os
    import sys

    from raypost.train.engine import extensions_in_this_env

    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    monkeypatch.setattr(sys, "prefix", "/opt/venvs/a")
    monkeypatch.setattr(sys, "base_prefix", "/usr")
    extensions_in_this_env()
    assert os.environ["TORCH_EXTENSIONS_DIR"] == "/opt/venvs/a/torch_extensions"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", "/scratch/ext")  # the user's choice stays
    extensions_in_this_env()
    assert os.environ["TORCH_EXTENSIONS_DIR"] == "/scratch/ext"
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR")
    monkeypatch.setattr(sys, "prefix", "/usr")  # no venv: torch's default, the system prefix may be read-only
    extensions_in_this_env()
    assert "TORCH_EXTENSIONS_DIR" not in os.environ


def test_the_venvs_ninja_builds_the_op(monkeypatch, tmp_path):
    """torch runs the first ``ninja`` on PATH; Debian's 1.11 and PyPI's 1.13 hash the build log's
    commands differently, so a learner that found the other one rebuilt the op (20-25 s). The
    venv's own ninja goes first, once."""
    import os
    import sys

    from raypost.train.engine import extensions_in_this_env

    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "ninja").write_text("")
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    monkeypatch.setattr(sys, "base_prefix", "/usr")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    extensions_in_this_env()
    extensions_in_this_env()
    assert os.environ["PATH"] == f"{tmp_path}/bin:/usr/bin:/bin"
    (tmp_path / "bin" / "ninja").unlink()  # a venv without ninja: PATH as it was
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    extensions_in_this_env()
    assert os.environ["PATH"] == "/usr/bin:/bin"
