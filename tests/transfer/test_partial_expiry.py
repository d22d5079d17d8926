"""The partial state of a transfer whose sender never came back (DEST/.rq-partial: its manifest, lock
files, and per unplaced file a .part, maybe reserved whole, and a journal) stayed for ever. `rq recv`
now removes it as it starts once nothing touched it for `keep_partial` (default 7 days; None/0:
never), says what it removed, and never touches a transfer that is open, one that was touched
since, placed files, or a file version a kept transfer shares (store.Store.expire)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from xfer_kit import TOKEN, receive_chunks

import transfer.store as store_mod
from transfer.codec import digest
from transfer.manifest import FileEntry, Manifest, file_key, make_manifest
from transfer.receiver import Receiver
from transfer.store import KEEP_PARTIAL, Store

CS = 1 << 20
DAY = 86400.0


def _entry(name: str, size: int, n: int) -> FileEntry:
    return FileEntry(name=name, size=size, mode=0o644, key=file_key(name, size, n, 1, CS))


def _abandoned(store: Store, m: Manifest) -> None:
    """A sender that sent the first chunk of each file and was never seen again."""
    plan = store.plan(m)
    for f, entry in enumerate(m.files):
        data = b"\1" * min(CS, entry.size)
        plan.write(f, 0, data)
        plan.make_durable([(f, 0, digest(data))])
    if plan.reservation is not None:
        plan.reservation.wait()
    plan.close()


def _later(mp: pytest.MonkeyPatch, seconds: float) -> None:
    """The store's wall clock `seconds` ahead: the state on disk reads that much older."""
    real = time.time
    mp.setattr(store_mod, "time", SimpleNamespace(time=lambda: real() + seconds))


def _state(dest: Path) -> list[str]:
    return sorted(p.name for p in (dest / ".rq-partial").iterdir())


def test_a_transfer_untouched_for_longer_than_a_week_is_removed_when_the_receiver_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dest = tmp_path / "dest"
    store = Store(dest)
    done = make_manifest(CS, [_entry("kept/a.bin", 3000, 1)])
    plan_roots = receive_chunks(store, done, [b"\2" * 3000], CS)
    store.plan(done).finalize(plan_roots, overwrite=False)
    gone = make_manifest(CS, [_entry("big.bin", 8 * CS, 2), _entry("small.bin", 100, 3)])
    _abandoned(store, gone)
    reserved = os.stat(dest / ".rq-partial" / f"{gone.files[0].key}.part").st_blocks * 512
    store.close()
    before = _state(dest)
    assert f"{gone.transfer_id}.manifest.json" in before

    _later(monkeypatch, 6 * DAY)  # within the default: a sender may still come back
    assert KEEP_PARTIAL == 7 * DAY
    receiver = Receiver(dest, TOKEN.encode())
    assert receiver.expired.transfers == () and receiver.expired.files == 0
    receiver.close()
    assert _state(dest) == before

    _later(monkeypatch, 8 * DAY)
    receiver = Receiver(dest, TOKEN.encode())
    expired = receiver.expired
    receiver.close()
    assert expired.transfers == (gone.transfer_id,)
    assert expired.older_than == KEEP_PARTIAL
    # manifest, .live, .owner, and per file its .part and journal
    assert expired.files == 3 + 2 * len(gone.files)
    assert expired.bytes >= max(reserved, 8 * CS // 2)  # the reserved .part's blocks were counted
    left = _state(dest)
    assert not any(gone.transfer_id in n for n in left)
    assert not any(f.key in n for f in gone.files for n in left)
    # the finished transfer's state is not partial state: its re-run still hears "complete"
    assert (dest / "kept/a.bin").read_bytes() == b"\2" * 3000
    store = Store(dest)
    assert store.completed(done)
    # and the abandoned one, sent again, starts over cleanly
    plan = store.plan(gone)
    assert plan.have_bytes() == 0
    plan.close()
    store.close()


@pytest.mark.parametrize("keep", [None, 0])
def test_never_expire(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keep: float | None) -> None:
    store = Store(tmp_path)
    m = make_manifest(CS, [_entry("a.bin", 2 * CS, 1)])
    _abandoned(store, m)
    store.close()
    before = _state(tmp_path)
    _later(monkeypatch, 3650 * DAY)
    receiver = Receiver(tmp_path, TOKEN.encode(), keep_partial=keep)
    assert receiver.expired.transfers == () and receiver.expired.older_than is None
    receiver.close()
    assert _state(tmp_path) == before


def test_a_transfer_open_in_another_process_or_being_planned_is_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its `.live` lock (a plan open anywhere) or its `.owner` lock (a plan being made): the other
    Store stands for another rq recv process; flocks of two open files conflict as across processes."""
    other = Store(tmp_path)
    m = make_manifest(CS, [_entry("a.bin", 2 * CS, 1), _entry("b.bin", 10, 2)])
    _abandoned(other, m)
    open_plan = other.plan(m)
    _later(monkeypatch, 30 * DAY)
    store = Store(tmp_path)
    assert store.expire().transfers == ()
    open_plan.close()
    # being planned: the planner holds <tid>.owner exclusively while it checks the destination
    with other._owning(m.transfer_id):
        assert store.expire().transfers == ()
    assert f"{m.transfer_id}.manifest.json" in _state(tmp_path)
    assert store.expire().transfers == (m.transfer_id,)
    store.close()
    other.close()


def test_a_superseded_transfers_own_partial_files_go_and_the_shared_ones_stay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A re-sent checkpoint with one file renamed: the new transfer's plan drops the old manifest
    (it names a file the new one sends) and the old transfer's other .part files are left with no
    manifest at all; nothing removed them, ever. They go by their own age now, while the file the
    new transfer shares (same version: same key, same .part) keeps every chunk it has. The store's
    clock is set so that its 1 s age falls between the two transfers' last changes (ctimes),
    however long the steps between them took."""
    store = Store(tmp_path)
    shared = _entry("shared.bin", 5000, 1)  # under RESERVE_MIN: the second plan does not touch it
    first = make_manifest(CS, [shared, _entry("only-first.bin", 10, 2)])
    _abandoned(store, first)
    first_ns = max(p.stat().st_ctime_ns for p in (tmp_path / ".rq-partial").iterdir())
    probe = tmp_path / "clock-probe"
    while True:  # until the file system's clock has moved on past the first transfer (by 1 ms)
        probe.write_bytes(b"")
        if probe.stat().st_ctime_ns > first_ns + 1_000_000:
            break
        time.sleep(0.001)
    between = (first_ns + probe.stat().st_ctime_ns) / 2e9
    second = make_manifest(CS, [shared, _entry("only-second.bin", 10, 3)])
    store.plan(second).close()  # its sender came and went: its state is fresh
    assert f"{first.transfer_id}.manifest.json" not in _state(tmp_path)  # superseded
    orphan = next(f.key for f in first.files if f.name == "only-first.bin")
    assert f"{orphan}.part" in _state(tmp_path)
    monkeypatch.setattr(store_mod, "time", SimpleNamespace(time=lambda: between + 1.0))
    expired = store.expire(1.0)
    assert expired.transfers == () and expired.files == 1
    store.recover(1.0)  # and the prune that follows takes its journal
    left = _state(tmp_path)
    assert not any(n.startswith(orphan) for n in left), left
    assert f"{shared.key}.part" in left and f"{shared.key}.journal" in left
    plan = store.plan(second)
    at = [f.name for f in second.files].index("shared.bin")
    assert plan.has(at, 0)  # the chunk that arrived for the shared file is still there
    plan.close()
    store.close()
