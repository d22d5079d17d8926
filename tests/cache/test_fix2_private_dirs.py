"""The disk cache was not private: rq made its cache dir, objects/ and tmp/ under the umask, so
under umask 022 every cached object (from private buckets too) was readable by every user, and
under umask 000 the cache dir and objects/ were 0777: another user could replace objects. The
RAM root was always 0700. Now every directory rq makes in a cache is 0700 whatever the umask, and
an existing one that others can write (an older rq's) is made 0700 when it is opened."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from cache import Cache


@pytest.fixture(params=[0o022, 0o000, 0o002])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_new_cache_is_private_whatever_the_umask(tmp_path: Path, ram_dir: Path, umask: int) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(b"secret" * 100)
    root = tmp_path / "made" / "by" / "rq"  # rq makes the missing directories above it too
    with Cache(root, ram_dir=ram_dir) as c:
        assert c.preload([str(src)]).objects == 1
        blob = c.path(str(src / "a"))
    for d in (root, root / "objects", root / "tmp", root.parent, root.parent.parent):
        assert _mode(d) == 0o700, (d, oct(_mode(d)))  # (old, umask 022: 0o755; 000: 0o777)
    # the object itself may keep its own mode: no other user can reach it
    assert blob.is_relative_to(root)


def test_an_existing_cache_that_others_can_write_is_made_private(tmp_path: Path, ram_dir: Path) -> None:
    root = tmp_path / "c"
    Cache(root, ram_dir=ram_dir).close()
    for d in (root, root / "objects", root / "tmp"):
        os.chmod(d, 0o777)  # what an older rq made under umask 000
    Cache(root, ram_dir=ram_dir).close()
    for d in (root, root / "objects", root / "tmp"):
        assert _mode(d) == 0o700, (d, oct(_mode(d)))


def test_a_cache_shared_read_only_on_purpose_keeps_its_mode(tmp_path: Path, ram_dir: Path) -> None:
    root = tmp_path / "c"
    Cache(root, ram_dir=ram_dir).close()
    os.chmod(root, 0o750)  # its owner lets the group read it
    Cache(root, ram_dir=ram_dir).close()
    assert _mode(root) == 0o750
