"""A tmpfs destination's space is reserved in a thread beside the first chunks (store.Store._reserve,
reserve.Reservation), not before the transfer may start. These tests hold it to what the synchronous
reservation promised: every big file reserved whole while its chunks arrive, chunks written
meanwhile kept intact, and the file system's margin never taken, also by many files of one
manifest or by a resumed file whose tail is written; and to what a thread must not do: go on
after its plan closed, or touch a file that a commit (in this process or another) sealed."""

from __future__ import annotations

import os
import resource
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from tmpfs_kit import own_tmpfs

import transfer.reserve as reserve_mod
from transfer.codec import digest, root_digest
from transfer.manifest import FileEntry, file_key, make_manifest
from transfer.receiver import Receiver
from transfer.reserve import RESERVE_PIECE, Reservation, in_memory
from transfer.store import Store

CS = 1 << 20


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    with tempfile.TemporaryDirectory(dir="/dev/shm", prefix="rq-test-reserve-") as d:
        fd = os.open(d, os.O_RDONLY)
        try:
            if not in_memory(fd):
                pytest.skip("/dev/shm is not tmpfs here")
        finally:
            os.close(fd)
        yield Path(d)


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of 256 MiB of its own (margin: 5%, 12.8 MiB)."""
    with own_tmpfs(tmp_path / "small", "size=256m") as mnt:
        yield mnt


def _entry(name: str, size: int, n: int) -> FileEntry:
    return FileEntry(name=name, size=size, mode=0o644, key=file_key(name, size, n, 1, CS))


def _reserved(path: Path, size: int) -> bool:
    return os.stat(path).st_blocks * 512 >= size


def _margin(path: Path) -> int:
    vfs = os.statvfs(path)
    return min(vfs.f_blocks * vfs.f_frsize // 20, 1 << 30)


def _free(path: Path) -> int:
    vfs = os.statvfs(path)
    return vfs.f_bavail * vfs.f_frsize


def test_tmpfs_files_are_reserved_whole_while_chunks_are_written(shm_dir: Path) -> None:
    """Checked once the first chunk of each file landed, long before the rest: a file written
    whole would pass a check made at the end with no reservation at all."""
    size = 2 * RESERVE_PIECE + 3 * CS + 12345  # several pieces, and a tail that is no whole piece
    m = make_manifest(CS, [_entry("a.bin", size, 1), _entry("b.bin", size, 2)])
    data = [os.urandom(size), os.urandom(size)]
    store = Store(shm_dir)
    plan = store.plan(m)
    parts = [shm_dir / ".rq-partial" / f"{e.key}.part" for e in m.files]
    digests: list[list[bytes]] = [[], []]

    def land(f: int, k: int) -> None:
        piece = data[f][k * CS : (k + 1) * CS]
        plan.write(f, k, piece)
        plan.make_durable([(f, k, digest(piece))])
        digests[f].append(digest(piece))

    for f in range(2):
        land(f, 0)
    assert plan.reservation is not None
    plan.reservation.wait()
    for f in range(2):
        assert _reserved(parts[f], size), "not reserved while the chunks were still to come"
        with open(parts[f], "rb") as fh:
            assert fh.read(CS) == data[f][:CS]  # the chunk written before it is kept
    for f in range(2):
        for k in range(1, m.files[f].chunks(CS)):
            land(f, k)
    roots = [root_digest(d).hex() for d in digests]
    assert plan.finalize(roots, overwrite=False) == 2 * size
    plan.close()
    for f, name in enumerate(("a.bin", "b.bin")):
        assert os.stat(shm_dir / name).st_size == size
        assert (shm_dir / name).read_bytes() == data[f]
    assert not any(p.exists() for p in parts)
    store.close()


def test_a_closed_plan_stops_reserving_and_its_resume_reserves_the_rest(
    shm_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """close() (Ctrl-C, a failed transfer's _release under the receiver's lock) reserved every
    queued file in full before returning. It now stops between pieces; the plan that resumes the
    transfer takes the reservation up again. The first piece is held (a gate around the real
    fallocate) until close() asked the thread to stop, so exactly that piece is reserved whatever
    the scheduling: this test used to assume the thread could not reserve all of them between
    plan() and close()."""
    m = make_manifest(CS, [_entry(f"s{n:02}.bin", RESERVE_PIECE, n) for n in range(4)])
    parts = [shm_dir / ".rq-partial" / f"{e.key}.part" for e in m.files]
    libc = reserve_mod._calls()
    real = libc.fallocate
    first, ours = threading.Event(), threading.Event()
    reserving: list[Reservation] = []

    def gated(fd: int, mode: int, off: int, n: int) -> int:
        if not first.is_set():
            first.set()
            assert ours.wait(10)
            assert reserving[0]._stop.wait(10)  # close() asked it to stop: only now this piece
        return int(real(fd, mode, off, n))

    monkeypatch.setattr(libc, "fallocate", gated)
    store = Store(shm_dir)
    plan = store.plan(m)
    assert plan.reservation is not None
    reserving.append(plan.reservation)
    ours.set()
    assert first.wait(10), "the reservation never started"
    plan.close()
    assert [_reserved(p, RESERVE_PIECE) for p in parts] == [True, False, False, False]
    plan = store.plan(m)
    assert plan.reservation is not None
    plan.reservation.wait()
    assert all(_reserved(p, RESERVE_PIECE) for p in parts)
    plan.close()
    store.close()


def test_a_second_plan_of_an_open_transfer_reserves_nothing(
    shm_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Receiver._acquire plans a transfer already open here again (a reconnecting sender's
    MANIFEST) only to re-check the destination, and closes that plan at once: it started a
    reservation thread of its own beside the open plan's, for nothing."""
    started: list[int] = []
    start = Reservation.start

    def counting(self: Reservation) -> None:
        started.append(len(self._files))
        start(self)

    monkeypatch.setattr(Reservation, "start", counting)
    m = make_manifest(CS, [_entry("a.bin", 2 * CS, 1)])
    receiver = Receiver(shm_dir, b"token")
    shared = receiver._acquire(m.transfer_id, m)
    again = receiver._acquire(m.transfer_id, m)
    assert again is shared
    assert [n for n in started if n] == [1], "the re-plan reserved again"
    receiver._release(m.transfer_id, again)
    receiver._release(m.transfer_id, shared)
    receiver.close()


def test_a_commit_in_another_process_is_not_undone_by_this_ones_reservation(shm_dir: Path) -> None:
    """rq recv --workers: the plan of one process reserves while another process (its control
    channel reconnected there) commits. A tmpfs fallocate moves the file's mtime, even over pages
    already written: a piece after the seal overwrote the source's mtime the commit had applied.
    Two Stores of one receiver (one owner) stand for the two processes: their plans, descriptors
    and locks are as separate as across processes, and neither waits for the other's thread."""
    size = 32 * RESERVE_PIECE  # sparse: 2 GiB to reserve, far more than the commit takes
    mtime = 1_600_000_000_123_456_789
    m = make_manifest(
        RESERVE_PIECE,
        [FileEntry("big.bin", size, 0o644, file_key("big.bin", size, 7, 1, RESERVE_PIECE), mtime_ns=mtime)],
    )
    records = [(0, k, digest(b"%d" % k)) for k in range(m.files[0].chunks(RESERVE_PIECE))]
    mine, theirs = Store(shm_dir, owner="one-receiver"), Store(shm_dir, owner="one-receiver")
    reserving = mine.plan(m)
    reserving.make_durable(records)  # every chunk journaled (their bytes do not matter here)
    committing = theirs.plan(m)
    root = root_digest([d for _, _, d in records]).hex()
    assert committing.finalize([root], overwrite=False) == size
    placed = os.stat(shm_dir / "big.bin")
    assert placed.st_mtime_ns == mtime
    reserving.close()
    assert os.stat(shm_dir / "big.bin").st_mtime_ns == mtime, "a reservation piece ran after the seal"
    mine.close()
    theirs.close()


def test_a_resumed_file_whose_tail_is_written_never_takes_the_margin(small_tmpfs: Path) -> None:
    """The per-piece check counted the whole file's blocks against the piece: with the last piece
    already written (a resume), the first looked free, and its fallocate took the margin that
    another writer had left since the file was queued. The file's whole need is checked now."""
    size = 3 * RESERVE_PIECE
    dfd = os.open(small_tmpfs, os.O_RDONLY | os.O_DIRECTORY)
    fd = os.open("x.part", os.O_RDWR | os.O_CREAT, 0o600, dir_fd=dfd)
    try:
        os.ftruncate(fd, size)
        os.pwrite(fd, b"\1" * RESERVE_PIECE, 2 * RESERVE_PIECE)  # the tail arrived before
        reservation = Reservation(dfd, "0" * 32)
        reservation.add("x.part", fd, size)  # 128 MiB to go, 192 MiB free: queued
        margin = _margin(small_tmpfs)
        with open(small_tmpfs / "other", "wb") as other:  # someone else takes room meanwhile
            other.write(b"\2" * (_free(small_tmpfs) - RESERVE_PIECE - margin // 2))
        assert RESERVE_PIECE <= _free(small_tmpfs) < RESERVE_PIECE + margin  # a piece fits, into the margin
        reservation.start()
        reservation.wait()
        reservation.stop()
        assert _free(small_tmpfs) >= margin - (64 << 10), "the reservation took the margin"
    finally:
        os.close(fd)
        os.close(dfd)


def test_many_files_of_one_manifest_never_take_a_small_tmpfs_margin(tmp_path: Path) -> None:
    """Each file checked alone would fit; together they would fill the file system. The
    background reservation counts what it has promised, and checks the margin again per piece."""
    with own_tmpfs(tmp_path / "small", "size=40m") as mnt:
        margin = _margin(mnt)
        size = 6 * CS
        m = make_manifest(CS, [_entry(f"f{n}.bin", size, n) for n in range(10)])  # 60 MiB into 40
        store = Store(mnt / "dst")
        plan = store.plan(m)
        assert plan.reservation is not None
        plan.reservation.wait()
        plan.close()
        assert _free(mnt) >= margin - (64 << 10)
        reserved = [_reserved(mnt / "dst" / ".rq-partial" / f"{e.key}.part", size) for e in m.files]
        assert reserved[0] and not all(reserved)
        store.close()


def test_a_manifest_of_many_big_files_holds_no_descriptor_per_file(shm_dir: Path) -> None:
    """Queued files are opened one at a time by the reserving thread: a manifest of thousands of
    shards must not need thousands of descriptors (the store holds none between operations)."""
    m = make_manifest(CS, [_entry(f"s{n:03}.bin", CS + 1, n) for n in range(120)])
    store = Store(shm_dir)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    in_use = len(os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (in_use + 40, hard))
    try:
        plan = store.plan(m)
        assert plan.reservation is not None
        plan.reservation.wait()
        plan.close()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    for e in m.files:
        assert _reserved(shm_dir / ".rq-partial" / f"{e.key}.part", CS + 1)
    store.close()
