"""A new cache's RAM root is named in /dev/shm after the cache's path, which anyone can predict: a
name taken by another user (or by something that is not a directory) made the cache refuse to open
(exit 2) until it was removed. The next name of the sequence is used instead."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from cache import Cache
from cache.layout import default_ram_root


def test_a_name_taken_by_a_file_is_passed_over(tmp_path: Path) -> None:
    root = tmp_path / "c"
    taken = default_ram_root(root)
    taken.write_bytes(b"squatter")
    try:
        with Cache(root) as c:
            assert c.layout.ram_root == default_ram_root(root, 1)
        assert taken.read_bytes() == b"squatter"  # not ours: left as it is
    finally:
        taken.unlink()
        shutil.rmtree(default_ram_root(root, 1), ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand a directory to another uid")
def test_a_name_taken_by_another_users_directory_is_passed_over(tmp_path: Path) -> None:
    root = tmp_path / "c"
    taken = default_ram_root(root)
    taken.mkdir(mode=0o755)
    os.chown(taken, 65534, 65534)
    try:
        with Cache(root) as c:
            assert c.layout.ram_root == default_ram_root(root, 1)
        assert os.stat(taken).st_uid == 65534 and not any(taken.iterdir())
    finally:
        taken.rmdir()
        shutil.rmtree(default_ram_root(root, 1), ignore_errors=True)
