"""Directory origins and paths the kernel will not open (ENAMETOOLONG) or that became a symlink
loop (ELOOP) while the tree was walked. A path too long read as a refusal ("cannot read X: File
name too long", reported as `denied`); a too-long source or Cache.open path said "cannot list" or
"not a regular file"; a directory replaced by a symlink loop stopped the whole walk."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cache import Cache
from cache.errors import BadSourceError
from cache.origins import LocalOrigin

PATH_MAX = 4096  # Linux, with the terminating NUL


def long_tree(src: Path) -> tuple[str, str]:
    """src/top and src/d…/…/d… (a directory path just under PATH_MAX) holding a file and a
    directory whose paths are over it, made through directory descriptors as cp -r and rsync
    make such trees. Returns (the too-long file's path, the too-deep directory's)."""
    src.mkdir()
    (src / "top").write_bytes(b"top")
    fd = os.open(src, os.O_RDONLY | os.O_DIRECTORY)
    path = str(src)
    while len(path) < PATH_MAX - 60:  # the last directory's path: PATH_MAX - 60 bytes
        name = "d" * min(250, max(1, PATH_MAX - 60 - len(path) - 1))
        os.mkdir(name, dir_fd=fd)
        inner = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd, path = inner, f"{path}/{name}"
    long_name = "f" * 200
    leaf = os.open(long_name, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
    os.write(leaf, b"leaf")
    os.close(leaf)
    os.mkdir("e" * 200, dir_fd=fd)
    os.close(fd)
    return f"{path}/{long_name}", f"{path}/{'e' * 200}"


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[tuple[Path, str, str]]:
    src = tmp_path / "src"
    file, directory = long_tree(src)
    yield src, file, directory
    shutil.rmtree(src)


@pytest.fixture
def preloaded(tmp_path: Path, ram_dir: Path, tree: tuple[Path, str, str]) -> Any:
    """The result of preloading the tree; its one file that fits was cached."""
    src = tree[0]
    with Cache(tmp_path / "c", ram_dir=ram_dir) as c:
        result = c.preload([str(src)])
        assert result.objects == 1 and c.read_bytes(str(src / "top")) == b"top"
    return result


def test_paths_too_long_fail_alone_saying_why(preloaded: Any, tree: tuple[Path, str, str]) -> None:
    _, file, directory = tree
    failed = {f.url: f.message for f in preloaded.failed}
    assert sorted(failed) == sorted([file, f"{directory}/"])
    # old: "cannot read FILE: File name too long", as a refusal would read
    for message in failed.values():
        assert "File name too long (its path is" in message, message
        assert f"over the {PATH_MAX - 1} the kernel opens (PATH_MAX)" in message, message


def test_paths_too_long_are_not_reported_as_denied(preloaded: Any) -> None:
    # old: both `denied` (exit 4, "a file or directory rq may not read")
    assert [f.kind for f in preloaded.failed] == ["bad_name", "bad_name"]


def test_a_source_or_open_path_too_long_is_a_bad_source(
    tmp_path: Path, ram_dir: Path, tree: tuple[Path, str, str]
) -> None:
    _, file, _ = tree
    with Cache(tmp_path / "c", ram_dir=ram_dir) as c:
        # old: CacheError "cannot list …: File name too long" (exit 1)
        with pytest.raises(BadSourceError, match=r"File name too long \(its path is"):
            c.preload([file])
        # old: NotFoundError "not a regular file rq can open: …" (exit 3)
        with pytest.raises(BadSourceError, match=r"File name too long \(its path is"):
            c.open(file)


def test_a_directory_replaced_by_a_symlink_loop_while_walked_is_skipped(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a").write_bytes(b"a")
    (src / "sub" / "b").write_bytes(b"b")
    (src / "z").mkdir()
    (src / "z" / "c").write_bytes(b"c")
    walk = LocalOrigin(src).list()
    assert next(walk).key == "a"  # src read: sub/ and z/ are still to walk
    shutil.rmtree(src / "sub")
    os.symlink("sub", src / "sub")  # a link to itself: ELOOP
    # old: OSError "Too many levels of symbolic links" (the run stopped: "cannot list SRC", exit 1)
    assert [info.key for info in walk] == ["z/c"]
