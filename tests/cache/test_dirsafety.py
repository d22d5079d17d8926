"""Directories rq must not adopt: its sweeps delete what they do not know, so adopting someone
else's directory (or one planted in /dev/shm under the name rq will pick) would delete their files.
Found by an exploratory test run as another local user; these run as whoever runs the suite."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from rqtest import run_rq

from cache import Cache, UnsafeDirError
from cache.errors import BadSourceError, CacheError
from cache.layout import default_ram_root


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    d = tmp_path / "victim"
    d.mkdir()
    for name in ("a", "b"):
        (d / name).write_text("precious")
    return d


@pytest.fixture
def source(tmp_path: Path) -> Path:
    d = tmp_path / "src"
    d.mkdir()
    (d / "x.bin").write_bytes(os.urandom(1000))
    return d


@pytest.fixture
def planted(tmp_path: Path) -> Iterator[Path]:
    """The RAM root rq would choose for tmp_path/cache: where an attacker plants things."""
    path = default_ram_root(tmp_path / "cache")
    yield path
    if path.is_symlink():
        path.unlink()
    else:
        shutil.rmtree(path, ignore_errors=True)


def test_a_directory_that_is_not_a_cache_is_refused_and_left_alone(tmp_path: Path, source: Path) -> None:
    scratch = tmp_path / "scratch"
    (scratch / "tmp").mkdir(parents=True)
    (scratch / "objects" / "ab").mkdir(parents=True)
    (scratch / "tmp" / "notes.txt").write_text("mine")
    (scratch / "objects" / "ab" / "model.pt").write_text("mine")
    with pytest.raises(UnsafeDirError, match="not an rq cache"):
        Cache(scratch)
    r = run_rq("preload", str(source), "--cache-dir", str(scratch))
    err = r.stderr.decode()
    assert r.returncode == 2  # a --cache-dir rq must not use is a bad argument
    assert "not an rq cache" in err and len(err.strip().splitlines()) <= 2, err
    r = run_rq("cache", "clear", "--yes", "--cache-dir", str(scratch))
    assert r.returncode == 3 and b"no rq cache at" in r.stderr, r.stderr
    assert (scratch / "tmp" / "notes.txt").read_text() == "mine"
    assert (scratch / "objects" / "ab" / "model.pt").read_text() == "mine"
    assert sorted(os.listdir(scratch)) == ["objects", "tmp"]  # no index was created in it


def test_a_planted_symlink_as_ram_root_is_passed_over(tmp_path: Path, planted: Path, victim: Path) -> None:
    planted.symlink_to(victim)
    # (refused with exit 2 until the squatted names were passed over: test_squatted_ram_name.py)
    with Cache(tmp_path / "cache") as c:
        assert c.layout.ram_root == default_ram_root(tmp_path / "cache", 1)
    shutil.rmtree(c.layout.ram_root)
    assert sorted(os.listdir(victim)) == ["a", "b"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a directory another user owns")
def test_a_ram_root_owned_by_another_user_is_passed_over(
    tmp_path: Path, planted: Path, victim: Path, source: Path
) -> None:
    (planted / "objects").mkdir(parents=True)
    (planted / "tmp").symlink_to(victim)
    os.chown(planted, 65534, 65534)
    r = run_rq("preload", str(source), "--tier", "disk", "--cache-dir", str(tmp_path / "cache"))
    assert r.returncode == 0, r.stderr
    shutil.rmtree(default_ram_root(tmp_path / "cache", 1))
    assert sorted(os.listdir(victim)) == ["a", "b"]
    assert sorted(os.listdir(planted)) == ["objects", "tmp"]  # another user's: left as it is


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a directory another user owns")
def test_a_known_ram_root_taken_by_another_user_is_passed_over(
    tmp_path: Path, planted: Path, victim: Path, source: Path
) -> None:
    # the index names its root: one replaced by another user's (after a reboot emptied /dev/shm)
    # is never used (nothing swept through its symlink); the cache moves to its next name
    Cache(tmp_path / "cache").close()
    shutil.rmtree(planted)
    (planted / "objects").mkdir(parents=True)
    (planted / "tmp").symlink_to(victim)
    os.chown(planted, 65534, 65534)
    try:
        r = run_rq("preload", str(source), "--tier", "disk", "--cache-dir", str(tmp_path / "cache"))
        assert r.returncode == 0, r.stderr.decode()
        assert os.readlink(tmp_path / "cache" / "ram") == str(default_ram_root(tmp_path / "cache", 1))
        assert sorted(os.listdir(victim)) == ["a", "b"]
    finally:
        shutil.rmtree(default_ram_root(tmp_path / "cache", 1), ignore_errors=True)


def test_a_ram_root_others_can_write_is_refused(tmp_path: Path, planted: Path) -> None:
    planted.mkdir()
    planted.chmod(0o777)
    with pytest.raises(UnsafeDirError, match="writable by other users"):
        Cache(tmp_path / "cache")


def test_a_new_ram_root_is_private(tmp_path: Path, planted: Path, source: Path) -> None:
    c = Cache(tmp_path / "cache")
    assert c.layout.ram_root == planted
    assert planted.stat().st_mode & 0o777 == 0o700
    c.close()


def test_sweeps_never_follow_a_symlink_inside_the_cache(
    tmp_path: Path, ram_dir: Path, victim: Path, source: Path
) -> None:
    c = Cache(tmp_path / "cache", ram_dir=ram_dir)
    c.close()
    shutil.rmtree(ram_dir / "tmp")
    (ram_dir / "tmp").symlink_to(victim)
    (ram_dir / "objects" / "zz").symlink_to(victim)
    for args in (["preload", str(source)], ["cache", "clear", "--yes"]):
        r = run_rq(*args, "--cache-dir", str(tmp_path / "cache"))
        assert r.returncode == 0, r.stderr.decode()
    assert sorted(os.listdir(victim)) == ["a", "b"]


def test_a_ram_dir_given_to_a_new_cache_must_be_empty(tmp_path: Path, victim: Path) -> None:
    (victim / "tmp").mkdir()
    (victim / "tmp" / "notes.txt").write_text("mine")
    with pytest.raises(UnsafeDirError, match="not empty"):
        Cache(tmp_path / "cache", ram_dir=victim)
    assert (victim / "tmp" / "notes.txt").read_text() == "mine"


def test_rqs_own_group_writable_ram_root_from_an_older_rq_is_tightened(tmp_path: Path, planted: Path) -> None:
    planted.mkdir()
    planted.chmod(0o775)  # what an older rq made under umask 002
    Cache(tmp_path / "cache").close()
    assert planted.stat().st_mode & 0o777 == 0o700


def test_a_cache_removed_with_rm_rf_leaves_no_ram_files_behind(
    tmp_path: Path, planted: Path, source: Path
) -> None:
    c = Cache(tmp_path / "cache")
    c.preload([str(source)], tier="ram")
    assert any((planted / "objects").rglob("*-x.bin"))
    c.close()
    shutil.rmtree(tmp_path / "cache")  # the index is gone; the RAM root stays in /dev/shm
    c = Cache(tmp_path / "cache")
    assert not [p for p in (planted / "objects").rglob("*") if p.is_file()]  # orphans swept
    assert c.preload([str(source)], tier="ram").objects == 1
    c.close()


@pytest.mark.parametrize("where", ["cache", "ram"])
def test_a_directory_that_cannot_be_made_is_a_cache_error(tmp_path: Path, where: str) -> None:
    """`Cache("/proc/x")` raised a bare FileNotFoundError from mkdir, outside the library's
    hierarchy (and the CLI said exit 3 "No such file or directory"): a path it cannot use."""
    kwargs = {"ram_dir": "/proc/rq-nowhere"} if where == "ram" else {}
    root = "/proc/rq-nowhere" if where == "cache" else tmp_path / "c"
    with pytest.raises(BadSourceError, match="cannot use /proc/rq-nowhere as the") as raised:
        Cache(root, **kwargs)  # type: ignore[arg-type]
    assert isinstance(raised.value, CacheError) and not isinstance(raised.value, OSError)


def test_rq_says_a_cache_dir_that_cannot_be_made_is_a_bad_argument(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a").write_bytes(b"a")
    res = run_rq("preload", str(tmp_path / "src"), "--cache-dir", "/proc/rq-nowhere")
    assert res.returncode == 2, res.stderr
    assert b"cannot use /proc/rq-nowhere as the cache directory" in res.stderr
    assert b"--cache-dir DIR or RQ_CACHE_DIR" in res.stderr  # (ct: a default under a read-only HOME)
    assert len(res.stderr.splitlines()) == 1
