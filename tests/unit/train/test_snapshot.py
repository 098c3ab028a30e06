"""``raypost.train.snapshot``: a last good copy of Ray Train's run snapshot is kept only from a
snapshot that parses, and a torn snapshot is replaced by it before a restart."""

from __future__ import annotations

import json

import pytest

from raypost.train.snapshot import LAST_GOOD, SNAPSHOT, keep_copy, restore_snapshot


def test_a_torn_snapshot_is_replaced_by_the_last_good_copy(tmp_path):
    good = json.dumps({"checkpoint_results": ["checkpoint_2"], "ray_version": "x"})
    (tmp_path / SNAPSHOT).write_text(good)
    assert keep_copy(tmp_path) and (tmp_path / LAST_GOOD).read_text() == good
    (tmp_path / SNAPSHOT).write_text(good[:17])  # cut short: a full disk during Ray Train's rewrite
    assert not keep_copy(tmp_path)  # the torn one is never copied over the good one
    assert (tmp_path / LAST_GOOD).read_text() == good
    assert restore_snapshot(tmp_path)
    assert (tmp_path / SNAPSHOT).read_text() == good
    assert not restore_snapshot(tmp_path)  # a snapshot that parses is left alone
    assert not list(tmp_path.glob("*.tmp"))


def test_an_empty_snapshot_without_a_good_copy_names_the_file_and_the_fix(tmp_path):
    assert not restore_snapshot(tmp_path)  # a new run: nothing to restore
    (tmp_path / SNAPSHOT).write_text("")
    with pytest.raises(RuntimeError, match=rf"{SNAPSHOT} is torn .*delete the file to start the run over"):
        restore_snapshot(tmp_path)
