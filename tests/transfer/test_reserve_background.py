"""A tmpfs destination's space is reserved in a thread beside the first chunks (store.Store._reserve,
store.Reservation), not before the transfer may start. These tests hold it to what the synchronous
reservation promised: every big file reserved whole by the time its plan closes, chunks written
meanwhile kept intact, and the file system's margin never taken, also by many files of one manifest."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from transfer.codec import digest, root_digest
from transfer.manifest import FileEntry, file_key, make_manifest
from transfer.store import RESERVE_PIECE, Store, in_memory

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


def _entry(name: str, size: int, n: int) -> FileEntry:
    return FileEntry(name=name, size=size, mode=0o644, key=file_key(name, size, n, 1, CS))


def test_tmpfs_files_are_reserved_whole_while_chunks_are_written(shm_dir: Path) -> None:
    size = 2 * RESERVE_PIECE + 3 * CS + 12345  # several pieces, and a tail that is no whole piece
    m = make_manifest(CS, [_entry("a.bin", size, 1), _entry("b.bin", size, 2)])
    data = [os.urandom(size), os.urandom(size)]
    store = Store(shm_dir)
    plan = store.plan(m)
    roots = []
    for f in range(2):  # written as they arrive, while the reservation may still be running
        digests = []
        for k in range(m.files[f].chunks(CS)):
            piece = data[f][k * CS : (k + 1) * CS]
            plan.write(f, k, piece)
            plan.make_durable([(f, k, digest(piece))])
            digests.append(digest(piece))
        roots.append(root_digest(digests).hex())
    parts = [shm_dir / ".rq-partial" / f"{e.key}.part" for e in m.files]
    assert plan.finalize(roots, overwrite=False) == 2 * size
    plan.close()
    for f, name in enumerate(("a.bin", "b.bin")):
        st = os.stat(shm_dir / name)
        assert st.st_size == size and st.st_blocks * 512 >= size
        assert (shm_dir / name).read_bytes() == data[f]
    assert not any(p.exists() for p in parts)
    store.close()


def test_a_closed_plan_leaves_its_tmpfs_files_reserved(shm_dir: Path) -> None:
    size = RESERVE_PIECE + 5 * CS
    m = make_manifest(CS, [_entry("c.bin", size, 3)])
    store = Store(shm_dir)
    store.plan(m).close()  # close waits for the reservation: nothing may run on after it
    st = os.stat(shm_dir / ".rq-partial" / f"{m.files[0].key}.part")
    assert st.st_size == size and st.st_blocks * 512 >= size
    store.close()


def test_many_files_of_one_manifest_never_take_a_small_tmpfs_margin(tmp_path: Path) -> None:
    """Each file checked alone would fit; together they would fill the file system. The
    background reservation counts what it has promised, and checks the margin again per piece."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root")
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", str(mnt)], capture_output=True
    ).returncode:
        pytest.skip("cannot mount a small tmpfs here")
    try:
        vfs = os.statvfs(mnt)
        margin = min(vfs.f_blocks * vfs.f_frsize // 20, 1 << 30)
        size = 6 * CS
        m = make_manifest(CS, [_entry(f"f{n}.bin", size, n) for n in range(10)])  # 60 MiB into 40
        store = Store(mnt / "dst")
        store.plan(m).close()
        left = os.statvfs(mnt)
        assert left.f_bavail * left.f_frsize >= margin - (64 << 10)
        reserved = [
            os.stat(mnt / "dst" / ".rq-partial" / f"{e.key}.part").st_blocks * 512 >= size for e in m.files
        ]
        assert reserved[0] and not all(reserved)
        store.close()
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, check=False)


def test_a_manifest_of_many_big_files_holds_no_descriptor_per_file(shm_dir: Path) -> None:
    """Queued files are opened one at a time by the reserving thread: a manifest of thousands of
    shards must not need thousands of descriptors (the store holds none between operations)."""
    import resource

    m = make_manifest(CS, [_entry(f"s{n:03}.bin", CS + 1, n) for n in range(120)])
    store = Store(shm_dir)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    in_use = len(os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (in_use + 40, hard))
    try:
        plan = store.plan(m)
        plan.close()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    for e in m.files:
        assert os.stat(shm_dir / ".rq-partial" / f"{e.key}.part").st_blocks * 512 >= CS + 1
    store.close()
