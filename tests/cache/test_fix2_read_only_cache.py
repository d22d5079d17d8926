"""A cache on a read-only file system (read-only media, a snapshot, a ro bind mount): every
command, ls/du/stat/verify included, exited 1 with "cannot use the cache index …: unable to open
database file" (a WAL index needs its -shm file, which SQLite could not make there). Reading now
works (the index opened `mode=ro`, else `immutable=1`); a change is one line, exit 2."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from rqtest import run_rq, small_tmpfs

from cache import Cache
from cache.errors import BadSourceError


@pytest.fixture
def ro_cache(tmp_path: Path, ram_dir: Path) -> Iterator[tuple[Path, Path]]:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(b"a" * 3000)
    (src / "b").write_bytes(b"b" * 5000)
    with small_tmpfs(tmp_path / "mnt", "8m") as mnt:
        with Cache(mnt / "c", ram_dir=ram_dir) as c:
            assert c.preload([str(src)]).objects == 2
        remount = subprocess.run(["mount", "-o", "remount,ro", str(mnt)], capture_output=True)
        if remount.returncode != 0:
            pytest.skip(f"cannot remount read-only: {remount.stderr.decode().strip()}")
        yield mnt / "c", src


def test_a_cache_on_a_read_only_file_system_can_be_read(ro_cache: tuple[Path, Path], ram_dir: Path) -> None:
    root, src = ro_cache
    with Cache(root, ram_dir=ram_dir) as c:  # (old: CacheError "unable to open database file")
        assert sorted(e.url for e in c.entries()) == [str(src / "a"), str(src / "b")]
        assert c.usage()["disk"]["bytes"] == 8000
        assert c.stat(str(src / "a")).size == 3000
        assert c.verify() == (2, [])
        assert c.read_bytes(str(src / "b")) == b"b" * 5000
        assert c.path(str(src / "a"), fresh=True).read_bytes() == b"a" * 3000
        with pytest.raises(BadSourceError, match="read-only"):
            c.evict(str(src / "a"))
        with pytest.raises(BadSourceError, match="read-only"):
            c.verify(repair=True)


def test_rq_cache_on_a_read_only_file_system(ro_cache: tuple[Path, Path]) -> None:
    root, src = ro_cache
    env = {"RQ_CACHE_DIR": str(root)}
    ls = run_rq("cache", "ls", "--json", env=env)
    assert ls.returncode == 0, ls.stderr  # (old: exit 1, "unable to open database file")
    assert ls.stdout.count(b'"event": "entry"') + ls.stdout.count(b'"event":"entry"') == 2
    evict = run_rq("cache", "evict", str(src / "a"), env=env)
    assert evict.returncode == 2
    assert b"read-only (its file system is read-only)" in evict.stderr
