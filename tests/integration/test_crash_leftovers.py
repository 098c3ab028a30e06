"""What a crash or a full disk leaves behind (issue 42): a full /dev/shm during a push is a clear
OSError naming the fixes, not a SIGBUS that kills learner rank 0 with no Python error (on a real
1 MiB tmpfs, in a child process: a SIGBUS would take pytest with it); a worker SIGKILLed while it
stages a checkpoint leaves a folder that the next save on its node removes."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import ROOT

WRITE = """
import sys, torch
from raypost.weights import specs_of
from raypost.weights.shm import VersionFiles
state = {"w": torch.ones(int(sys.argv[2]) // 4)}
VersionFiles(sys.argv[1]).write(1, specs_of(state), [state])
print("written")
"""


@pytest.fixture
def small_tmpfs():
    where = Path(tempfile.mkdtemp(prefix="rp-tmpfs-"))
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)], capture_output=True)
    if mounted.returncode != 0:
        shutil.rmtree(where)
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    yield where
    subprocess.run(["umount", str(where)], check=True)
    where.rmdir()


def test_a_version_larger_than_the_free_shm_is_a_clear_error(small_tmpfs: Path):
    def write(nbytes: int) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-c", WRITE, str(small_tmpfs / "run"), str(nbytes)]
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)

    fits = write(256 * 1024)
    assert fits.returncode == 0 and "written" in fits.stdout, fits.stderr[-2000:]
    full = write(4 * 1024 * 1024)  # the 1 MiB tmpfs already holds version 1
    assert full.returncode == 1, (full.returncode, full.stderr[-2000:])  # -7 would be the SIGBUS
    assert "has no room for a 4.0 MiB weight version" in full.stderr
    assert "rollout.weights.transport=object_store" in full.stderr
    assert not list((small_tmpfs / "run").glob("*.tmp")), "the half-written file is removed"


def test_a_killed_workers_checkpoint_staging_folder_is_swept(tmp_path: Path):
    """A worker SIGKILLed while it stages a checkpoint leaves its folder; the next save on that
    node removes it, and leaves a live worker's alone."""
    from raypost.train.checkpointing import sweep_orphans

    stage = (
        "import os, tempfile, signal\n"
        "from raypost.train.checkpointing import CKPT_PREFIX\n"
        f"d = tempfile.mkdtemp(prefix=f'{{CKPT_PREFIX}}{{os.getpid()}}-', dir={str(tmp_path)!r})\n"
        "open(os.path.join(d, 'shard.pt'), 'wb').write(b'x' * 1000)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    killed = subprocess.run([sys.executable, "-c", stage], cwd=ROOT, timeout=120)
    assert killed.returncode == -9
    [orphan] = tmp_path.glob("raypost-ckpt-*")
    mine = tempfile.mkdtemp(prefix=f"raypost-ckpt-{__import__('os').getpid()}-", dir=tmp_path)
    assert sweep_orphans(str(tmp_path)) == [orphan]
    assert not orphan.exists() and Path(mine).exists()
