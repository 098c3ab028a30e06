"""``raypost.train.snapshot``: copies of Ray Train's run snapshot are kept only from a snapshot
that parses, in two slots whose space is reserved up front, and a torn snapshot is replaced by the
newest whole copy before a restart (or set aside when there is none)."""

from __future__ import annotations

import json

from raypost.train.snapshot import RESERVE_BYTES, SLOTS, SNAPSHOT, TORN, keep_copy, reserve, restore_snapshot


def _snapshot(n: int) -> str:
    return json.dumps({"checkpoint_results": [f"checkpoint_{i}" for i in range(n)], "ray_version": "x"})


def test_a_torn_snapshot_is_replaced_by_the_newest_whole_copy(tmp_path):
    assert not restore_snapshot(tmp_path)  # a new run: nothing to restore; the slots are reserved
    assert [(tmp_path / s).stat().st_size for s in SLOTS] == [RESERVE_BYTES, RESERVE_BYTES]
    for n in (1, 2, 3):
        (tmp_path / SNAPSHOT).write_text(_snapshot(n))
        assert keep_copy(tmp_path)
    (tmp_path / SNAPSHOT).write_text(_snapshot(4)[:17])  # cut short: a full disk during Ray Train's rewrite
    assert not keep_copy(tmp_path)  # a torn one is never copied
    assert restore_snapshot(tmp_path)
    assert (tmp_path / SNAPSHOT).read_text() == _snapshot(3)
    assert not restore_snapshot(tmp_path)  # a snapshot that parses is left alone
    assert [(tmp_path / s).stat().st_size for s in SLOTS] == [RESERVE_BYTES, RESERVE_BYTES]  # written in place
    assert not list(tmp_path.glob("*.tmp"))


def test_a_slot_torn_by_a_kill_leaves_the_other_one(tmp_path):
    reserve(tmp_path)
    for n in (1, 2):
        (tmp_path / SNAPSHOT).write_text(_snapshot(n))
        keep_copy(tmp_path)
    newest = max(SLOTS, key=lambda s: json.loads((tmp_path / s).read_text())["seq"])
    (tmp_path / newest).write_bytes(b'{"seq": 2, "snap')  # a copy cut short by a kill
    (tmp_path / SNAPSHOT).write_text("")
    assert restore_snapshot(tmp_path) and (tmp_path / SNAPSHOT).read_text() == _snapshot(1)


def test_copies_fit_in_their_reserved_space_on_a_full_disk(tmp_path, monkeypatch):
    reserve(tmp_path)

    def full(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("os.posix_fallocate", full)  # any new allocation fails from now on
    (tmp_path / SNAPSHOT).write_text(_snapshot(2))
    assert keep_copy(tmp_path)
    (tmp_path / SNAPSHOT).write_text(_snapshot(9) * 30_000)  # past the reserve: needs new space
    assert not keep_copy(tmp_path)


def test_a_torn_first_snapshot_is_set_aside_and_the_run_starts_over(tmp_path):
    (tmp_path / SNAPSHOT).write_text("")  # the first checkpoint's snapshot, torn: none was whole
    assert not restore_snapshot(tmp_path)
    assert not (tmp_path / SNAPSHOT).exists() and (tmp_path / TORN).read_text() == ""
