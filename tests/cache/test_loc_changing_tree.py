"""A directory origin that changes while `rq preload` copies it, as `rsync -a` / `cp -r` users meet:
names replaced by sockets, device nodes or symlink loops after they were listed, directories
removed while the tree is walked, and a source reached through a symlink into the cache itself."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cache import Cache
from cache import events as ev
from cache.errors import BadSourceError
from cache.origins import LocalOrigin


def _swap(path: Path, into: str, keep: list[Any]) -> None:
    path.unlink()
    if into == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        keep.append(s)
    elif into == "loop":
        os.symlink(path.name, path)  # a link to itself: ELOOP
    else:  # a character device with no driver behind it: open() says ENXIO/ENODEV
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(250, 77))


@pytest.mark.parametrize("into", ["socket", "loop", "device"])
def test_a_name_replaced_after_listing_fails_alone(tmp_path: Path, ram_dir: Path, into: str) -> None:
    if into == "device" and os.geteuid() != 0:
        pytest.skip("mknod needs root")
    src = tmp_path / "src"
    src.mkdir()
    for n in "abc":
        (src / n).write_bytes(n.encode() * 100)
    keep: list[Any] = []

    def on_event(e: object) -> None:
        # planned (listed and checked against the index), not yet fetched
        if isinstance(e, ev.Planned) and not keep:
            keep.append(None)
            _swap(src / "b", into, keep)

    c = Cache(tmp_path / "c", ram_dir=ram_dir)
    try:
        # was: UnreachableError ("cannot open …: No such device or address" / "Too many levels of
        # symbolic links"), which stops the whole run with exit 6, "re-run to continue"
        result = c.preload([str(src)], on_event=on_event)
        assert [(f.url, f.kind) for f in result.failed] == [(str(src / "b"), "not_found")]
        assert result.objects == 2
        assert c.read_bytes(str(src / "c")) == b"c" * 100
    finally:
        c.close()
        for s in keep:
            if s is not None:
                s.close()


@pytest.mark.parametrize("into", ["gone", "file"])
def test_a_directory_removed_while_the_tree_is_listed_is_skipped(tmp_path: Path, into: str) -> None:
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "b").mkdir()
    (src / "a" / "f").write_bytes(b"a")
    for i in range(3):
        (src / "b" / f"f{i}").write_bytes(b"b")
    listing = LocalOrigin(src).list()
    first = next(listing)  # the walk takes the last directory first: b, then a
    assert first.key == "b/f0"
    shutil.rmtree(src / "a")  # removed (or replaced) after the walk saw it, before it went in
    if into == "file":
        (src / "a").write_bytes(b"now a file")
    # was: FileNotFoundError / NotADirectoryError out of the listing, which stopped the run
    # ("cannot list SRC: No such file or directory", exit 1); cp -r and rsync go on
    assert [info.key for info in listing] == ["b/f1", "b/f2"]


def test_a_source_through_a_symlink_into_the_cache_is_refused(tmp_path: Path, ram_dir: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(b"a")
    c = Cache(tmp_path / "c", ram_dir=ram_dir)
    try:
        c.preload([str(src)])
        link = tmp_path / "link"
        link.symlink_to(tmp_path / "c" / "objects")
        # was: preloaded, caching the cache's own blob as a new entry (and its copy on the next run)
        with pytest.raises(BadSourceError, match="own directory"):
            c.preload([str(link)])
        # a file of the cache as the source: its index, a blob (both were cached as entries)
        blob = next((tmp_path / "c" / "objects").glob("*/*"))
        for inside in (tmp_path / "c" / "index.sqlite3", blob, link / blob.parent.name / blob.name):
            with pytest.raises(BadSourceError, match="own directory"):
                c.preload([str(inside)])
        assert len(c.entries()) == 1
    finally:
        c.close()


def _deep_tree(src: Path) -> Path:
    """src/top and src/d…/d…/…/leaf with a path longer than PATH_MAX (4096), made through
    directory descriptors as `cp -r` and rsync copy such trees; returns the first too-deep one."""
    src.mkdir()
    (src / "top").write_bytes(b"top")
    fd = os.open(src, os.O_RDONLY | os.O_DIRECTORY)
    name = "d" * 250
    for _ in range(20):
        os.mkdir(name, dir_fd=fd)
        inner = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = inner
    leaf = os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
    os.write(leaf, b"leaf")
    os.close(leaf)
    os.close(fd)
    deep = src
    while len(str(deep / name)) < 4096:
        deep = deep / name
    return deep / name


def test_a_tree_deeper_than_path_max_fails_where_it_is_too_deep(tmp_path: Path, ram_dir: Path) -> None:
    src = tmp_path / "src"
    deep = _deep_tree(src)
    c = Cache(tmp_path / "c", ram_dir=ram_dir)
    try:
        # was: "cannot list SRC: File name too long", the whole run stopped (exit 1)
        result = c.preload([str(src)])
        assert result.objects == 1 and c.read_bytes(str(src / "top")) == b"top"
        assert [f.url for f in result.failed] == [f"{deep}/"]
        assert "File name too long" in result.failed[0].message
    finally:
        c.close()
    shutil.rmtree(src)


# root reads every file whatever its mode: drop the capabilities that allow it, as a user would run
AS_USER = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search",
           "--inh-caps", "-dac_override,-dac_read_search", "--"]  # fmt: skip


def _preload_as_user(src: Path, cache_dir: Path) -> subprocess.CompletedProcess[bytes]:
    cmd = [
        *AS_USER,
        sys.executable,
        "-m",
        "rqcli",
        "--json",
        "preload",
        str(src),
        "--cache-dir",
        str(cache_dir),
    ]
    return subprocess.run(cmd, capture_output=True, env={**os.environ, "CI": "1"}, timeout=120)


def _failed(out: bytes) -> dict[str, str]:
    lines = [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]
    return {e["url"]: e["kind"] for e in lines if e["event"] == "failed"}


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
def test_names_rq_may_list_but_not_read_fail_alone(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "ok").mkdir(parents=True)
    (src / "ok" / "f").write_bytes(b"ok")
    (src / "listonly").mkdir()  # r--: its names can be listed, not looked up
    for name in ("g", "h"):
        (src / "listonly" / name).write_bytes(name.encode())
    (src / "listonly" / "sub").mkdir()
    hidden = tmp_path / "hidden"  # ---: a symlink into it cannot be followed
    hidden.mkdir()
    (hidden / "h").write_bytes(b"h")
    (src / "link").symlink_to(hidden / "h")
    os.chmod(src / "listonly", 0o444)
    os.chmod(hidden, 0)
    try:
        out = _preload_as_user(src, tmp_path / "c")
        under = _preload_as_user(hidden / "sub", tmp_path / "c2")
    finally:
        os.chmod(src / "listonly", 0o755)
        os.chmod(hidden, 0o755)
    # was: the first such name stopped the whole run, exit 1 ("cannot read SRC/link: Permission
    # denied"); now each fails alone as `denied` (exit 4), as an unreadable file does
    assert out.returncode == 4, out.stderr
    # (the list-only directory fails as one: its names, subdirectory included, cannot be opened)
    assert _failed(out.stdout) == {str(src / "link"): "denied", f"{src / 'listonly'}/": "denied"}
    assert json.loads(out.stdout.splitlines()[-1])["objects"] == 1
    # a source under a directory rq may not search: denied (exit 4), was "cannot list" (exit 1)
    assert under.returncode == 4, under.stderr
    assert b"Permission denied" in under.stderr and not (tmp_path / "c2").exists()
