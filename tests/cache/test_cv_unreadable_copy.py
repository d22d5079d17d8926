"""A cached file that cannot be read back (EIO from a failing disk) stopped `rq cache verify` at the
first such entry ("rq: error: Input/output error", exit 1, no summary), so `--repair` could not get
past it, and `Cache.open` / `rq cache cat` failed with a bare OSError naming nothing. The copy is a
bad copy like a corrupt one: verify names it (its own line and event, exit 5) and checks the rest,
--repair drops it, and open fetches the object again from its origin, or raises a VerifyError
(with a hint of a failing disk) naming the entry and its file. EIO is injected by wrapping the digest/read calls
for one cached file only (the reviewer's repro used strace's fault injection)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import cache.api
import cache.digests
from cache import Cache, VerifyError

RQ = [sys.executable, "-m", "rqcli"]


@pytest.fixture
def cached(tmp_path: Path, ram_dir: Path) -> Iterator[tuple[Path, Path, list[Path]]]:
    src = tmp_path / "src"
    src.mkdir()
    files = []
    for i in range(3):
        f = src / f"f{i}.bin"
        f.write_bytes(os.urandom(300_000 + i))
        files.append(f)
    root = tmp_path / "cr"
    with Cache(root, ram_dir=ram_dir) as c:
        c.preload([str(src) + "/"])
    yield root, src, files


def _blob(root: Path, url: Path) -> Path:
    with Cache(root) as c:
        return c.path(str(url))


def _eio_on(monkeypatch: pytest.MonkeyPatch, bad: Path) -> None:
    """Reads of `bad`'s file fail with EIO, as on a failing disk (by inode and change time: a
    copy landed again may get the inode number of the one dropped)."""
    st = os.stat(bad)
    ino = (st.st_ino, st.st_ctime_ns)
    real_preadv, real_read = os.preadv, os.read

    def broken(fd: int) -> bool:
        try:
            st = os.fstat(fd)
        except OSError:
            return False
        return (st.st_ino, st.st_ctime_ns) == ino

    def preadv(fd: int, buffers: Any, offset: int, *rest: Any) -> int:
        if broken(fd):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_preadv(fd, buffers, offset, *rest)

    def read(fd: int, n: int) -> bytes:
        if broken(fd):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_read(fd, n)

    monkeypatch.setattr(cache.digests.os, "preadv", preadv)
    monkeypatch.setattr(cache.api.os, "read", read)


def test_verify_names_an_unreadable_entry_and_checks_the_rest(
    cached: tuple[Path, Path, list[Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, _src, files = cached
    bad = _blob(root, files[1])
    _eio_on(monkeypatch, bad)
    seen: list[Any] = []
    with Cache(root) as c:
        checked, problems = c.verify(on_problem=seen.append)
    assert checked == 3
    assert [(p.url, p.kind) for p in problems] == [(str(files[1]), "unreadable")]
    assert str(bad) in problems[0].problem and "Input/output error" in problems[0].problem
    with Cache(root) as c:
        checked, problems = c.verify(repair=True)
        assert [p.kind for p in problems] == ["unreadable"]
        assert [e.url for e in c.entries()] == [str(files[0]), str(files[2])]


def test_open_fetches_an_unreadable_copy_again(
    cached: tuple[Path, Path, list[Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, _src, files = cached
    bad = _blob(root, files[1])
    _eio_on(monkeypatch, bad)  # (the copy landed again is a new file, readable)
    with Cache(root) as c:
        assert c.read_bytes(str(files[1])) == files[1].read_bytes()


def test_open_names_the_entry_and_file_when_every_copy_is_unreadable(
    cached: tuple[Path, Path, list[Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, _src, files = cached
    real_read = os.read

    def read(fd: int, n: int) -> bytes:
        if os.fstat(fd).st_size == 300_001 and Path(os.readlink(f"/proc/self/fd/{fd}")).is_relative_to(root):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_read(fd, n)

    monkeypatch.setattr(cache.api.os, "read", read)
    with Cache(root) as c, pytest.raises(VerifyError) as got:
        c.open(str(files[1]))
    assert got.value.hint is not None and "dmesg" in got.value.hint
    message = str(got.value)
    assert str(files[1]) in message and str(root) in message and "Input/output error" in message


# the CLI under EIO: sitecustomize-free, a wrapper script that injects it by inode and runs rq
WRAP = r"""
import errno, os, sys
ino = tuple(map(int, sys.argv.pop(1).split(":")))
real_preadv, real_read = os.preadv, os.read
def broken(fd):
    try:
        st = os.fstat(fd)
    except OSError:
        return False
    return (st.st_ino, st.st_ctime_ns) == ino
def preadv(fd, buffers, offset, *rest):
    if broken(fd):
        raise OSError(errno.EIO, os.strerror(errno.EIO))
    return real_preadv(fd, buffers, offset, *rest)
def read(fd, n):
    if broken(fd):
        raise OSError(errno.EIO, os.strerror(errno.EIO))
    return real_read(fd, n)
os.preadv, os.read = preadv, read
from rqcli.console import main
sys.argv[0] = "rq"
main()
"""


def _rq(ino: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-c", WRAP, str(ino), *args], capture_output=True, cwd=cwd, timeout=120, check=False
    )


def test_cli_verify_reports_unreadable_and_repair_drops_it(cached: tuple[Path, Path, list[Path]]) -> None:
    root, src, files = cached
    st = os.stat(_blob(root, files[1]))
    ino = f"{st.st_ino}:{st.st_ctime_ns}"
    out = _rq(ino, "cache", "verify", "--cache-dir", str(root), cwd=src)
    assert out.returncode == 5, out.stderr
    assert b"UNREADABLE" in out.stdout and b"Input/output error" in out.stdout
    assert b"rq: error: 1 unreadable entries" in out.stderr and b"dmesg" in out.stderr
    out = _rq(ino, "cache", "verify", "--cache-dir", str(root), "--json", cwd=src)
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert [line["event"] for line in lines] == ["unreadable", "summary"]
    assert lines[-1]["unreadable"] == 1 and lines[-1]["corrupt"] == 0 and lines[-1]["checked"] == 3
    out = _rq(ino, "cache", "verify", "--cache-dir", str(root), "--repair", cwd=src)
    assert out.returncode == 0, out.stderr
    out = _rq(ino, "cache", "cat", "--cache-dir", str(root), str(files[1]), cwd=src)
    assert out.returncode == 0 and out.stdout == files[1].read_bytes()
