"""A directory origin's file rewritten with the same size within one timestamp tick (whole seconds
on ext4 with 128-byte inodes, FAT, NFSv3, older kernels) kept its version (`mtime;size`), so
Cache.open and preload served the first bytes for ever. The version now also holds the inode and
ctime (a file renamed over the old one has another inode), and an entry read within the tick of its
last change is "racy": its next check hashes the origin file again instead of trusting its stat."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import cache.landing
import cache.origins
from cache import Cache


def _coarse_stat(monkeypatch: pytest.MonkeyPatch, changed_ns: int) -> None:
    """Every directory origin file stats as `changed_ns` (mtime and ctime) and inode 1, whatever
    is written to it: a file system whose timestamps did not tick between the writes."""

    def version(st: os.stat_result) -> str:
        return f"mtime:{changed_ns};size:{st.st_size};ino:1;ctime:{changed_ns}"

    monkeypatch.setattr(cache.origins, "local_version", version)
    monkeypatch.setattr("cache.api.local_version", version, raising=False)  # (absent in the old code)


def test_racy_at_marks_a_file_changed_within_the_window_of_its_read() -> None:
    now = time.time_ns()
    recent = f"mtime:{now - 10**9};size:3;ino:5;ctime:{now - 10**9}"
    old = f"mtime:{now - 60 * 10**9};size:3;ino:5;ctime:{now - 60 * 10**9}"
    touched = f"mtime:{now - 60 * 10**9};size:3;ino:5;ctime:{now}"  # e.g. renamed or chmod'ed just now
    assert cache.landing.racy_at(recent, now)
    assert cache.landing.racy_at(touched, now)
    assert not cache.landing.racy_at(old, now)
    assert cache.landing.racy_at(f"mtime:{now + 10**9};size:3", now)  # (a server clock ahead)
    assert not cache.landing.racy_at("etag:abc;size:3", now)  # S3: ETags are not timestamps
    year = 365 * 86400 * 10**9  # an mtime set ahead (touch -d, cp -p, tar) with the ctime long past:
    assert not cache.landing.racy_at(f"mtime:{now + year};size:3;ino:5;ctime:{now - 60 * 10**9}", now)


def test_a_file_stamped_in_the_future_is_trusted_on_its_stat(
    tmp_path: Path, ram_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ck: `touch -d 2099-01-01 f` kept f's entry racy until 2099, so every open hashed the
    origin file again (on NFS: read it whole over the network). Only its ctime, which nobody but
    the kernel sets, says when it last changed."""
    now = time.time_ns()

    def version(st: os.stat_result) -> str:
        return f"mtime:{now + 365 * 86400 * 10**9};size:{st.st_size};ino:1;ctime:{now - 60 * 10**9}"

    monkeypatch.setattr(cache.origins, "local_version", version)
    monkeypatch.setattr("cache.api.local_version", version, raising=False)
    src = tmp_path / "f.bin"
    src.write_bytes(b"A" * 5000)
    with Cache(tmp_path / "c", ram_dir=ram_dir) as c:
        assert c.read_bytes(str(src)) == b"A" * 5000
        assert not c.stat(str(src)).version.endswith(";racy")  # (old code: racy)


def test_a_same_size_rewrite_in_one_tick_is_never_served_stale(
    tmp_path: Path, ram_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _coarse_stat(monkeypatch, time.time_ns())
    src = tmp_path / "f.bin"
    src.write_bytes(b"A" * 5000)
    with Cache(tmp_path / "c", ram_dir=ram_dir) as c:
        assert c.read_bytes(str(src)) == b"A" * 5000
        src.write_bytes(b"B" * 5000)  # same size, same (coarse) stat
        assert c.read_bytes(str(src)) == b"B" * 5000  # (old code: the A bytes)
        assert c.stat(str(src)).version.endswith(";racy")
        assert c.path(str(src), fresh=True).read_bytes() == b"B" * 5000
        src.write_bytes(b"C" * 5000)
        assert c.path(str(src), fresh=True).read_bytes() == b"C" * 5000
        assert c.verify() == (1, [])


def test_a_racy_entry_is_refetched_by_the_next_preload(
    tmp_path: Path, ram_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _coarse_stat(monkeypatch, time.time_ns())
    src = tmp_path / "src"
    src.mkdir()
    (src / "f.bin").write_bytes(b"A" * 5000)
    with Cache(tmp_path / "c", ram_dir=ram_dir) as c:
        assert c.preload([str(src)]).objects == 1
        unchanged = c.preload([str(src)])  # racy: hashed at the origin again, the same
        assert (unchanged.objects, unchanged.skipped) == (0, 1)
        (src / "f.bin").write_bytes(b"B" * 5000)
        again = c.preload([str(src)])
        assert (again.objects, again.skipped, again.failed) == (1, 0, [])  # (old code: skipped 1)
        assert c.read_bytes(str(src / "f.bin")) == b"B" * 5000


def test_a_racy_mark_is_dropped_once_the_origin_is_old_enough(
    tmp_path: Path, ram_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _coarse_stat(monkeypatch, time.time_ns() - 1_000_000_000)
    src = tmp_path / "f.bin"
    src.write_bytes(b"A" * 5000)
    with Cache(tmp_path / "c", ram_dir=ram_dir) as c:
        c.read_bytes(str(src))
        racy = c.stat(str(src))
        assert racy.version.endswith(";racy")
        assert c.read_bytes(str(src)) == b"A" * 5000  # the origin hashed again: same, still racy
        assert c.stat(str(src)).version == racy.version
        monkeypatch.setattr(cache.landing, "RACY_WINDOW_NS", 500_000_000)  # (instead of waiting)
        assert c.read_bytes(str(src)) == b"A" * 5000
        now = c.stat(str(src))
        assert now.version == racy.version.removesuffix(";racy")
        assert (now.blob, now.created) == (racy.blob, racy.created)  # kept, not fetched again
        assert c.preload([str(src)]).skipped == 1


def test_an_entry_of_the_old_version_format_is_fetched_once_more(tmp_path: Path, ram_dir: Path) -> None:
    src = tmp_path / "f.bin"
    src.write_bytes(b"A" * 5000)
    os.utime(src, ns=(10**18, 10**18))
    with Cache(tmp_path / "c", ram_dir=ram_dir) as c:
        c.read_bytes(str(src))
        st = os.stat(src)
        with c._state().index.write() as db:  # as an older rq recorded it
            db.execute("UPDATE entries SET version = ?", (f"mtime:{st.st_mtime_ns};size:{st.st_size}",))
        assert c.read_bytes(str(src)) == b"A" * 5000
        assert ";ino:" in c.stat(str(src)).version


@pytest.fixture
def coarse_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory on ext4 with 128-byte inodes: whole-second mtime and ctime."""
    if os.geteuid() != 0 or shutil.which("mkfs.ext4") is None:
        pytest.skip("needs root and mkfs.ext4 to loop-mount an ext4 with whole-second timestamps")
    image, mnt = tmp_path / "coarse.img", tmp_path / "coarse"
    mnt.mkdir()
    with open(image, "wb") as fh:
        fh.truncate(64 << 20)
    made = subprocess.run(["mkfs.ext4", "-q", "-F", "-I", "128", str(image)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"mkfs.ext4 -I 128 failed: {made.stderr.decode().strip()}")
    mounted = subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot loop-mount an ext4 image here: {mounted.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)
        image.unlink()


@pytest.mark.parametrize("how", ["in_place", "renamed_over"])
def test_whole_second_timestamps(coarse_dir: Path, tmp_path: Path, ram_dir: Path, how: str) -> None:
    src = coarse_dir / "f.bin"
    with Cache(tmp_path / "c", ram_dir=ram_dir) as c:
        for attempt in range(3):  # both writes and the read within one second of the clock
            if time.time() % 1 > 0.7:
                time.sleep(1.02 - time.time() % 1)
            start = time.time()
            src.write_bytes(b"A%d" % attempt * 2000)
            assert c.read_bytes(str(src)) == b"A%d" % attempt * 2000
            before = os.stat(src)
            if how == "in_place":
                with open(src, "r+b") as fh:
                    fh.write(b"B%d" % attempt * 2000)
            else:
                (coarse_dir / "f.tmp").write_bytes(b"B%d" % attempt * 2000)
                os.rename(coarse_dir / "f.tmp", src)
            after = os.stat(src)
            if int(start) == int(time.time()):
                break
        else:
            pytest.skip("could not write twice within one second of the clock (a loaded machine)")
        assert before.st_mtime_ns % 10**9 == 0  # the file system keeps whole seconds
        assert (before.st_mtime_ns, before.st_size) == (after.st_mtime_ns, after.st_size)
        # (old code: the A bytes, for ever)
        assert c.read_bytes(str(src)) == b"B%d" % attempt * 2000
