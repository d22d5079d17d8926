"""An index write refused once for want of room (EDQUOT on a write, ENOSPC on an fsync: SQLite says
only "disk I/O error", SQLITE_IOERR_WRITE / _FSYNC) exited 1 ("cannot use the cache index …: disk
I/O error"): the check rq made after it (a small write of its own beside the index) found room by
then. It is exit 7, worded as the landing path words it (a quota named as such), from the errno
SQLite recorded for the write it could not make. A real I/O error (EIO) stays exit 1. Real SQLite,
real faults: strace injects one refused call into the index's WAL, nothing else."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")

CASES = [
    ("pwrite64", "EDQUOT", 7, "disk quota"),
    ("fdatasync", "ENOSPC", 7, "no space left on the file system"),
    ("fdatasync", "EDQUOT", 7, "disk quota"),
    ("pwrite64", "EIO", 1, "disk I/O error"),
]


def _preload(src: Path, cache: Path, inject: str | None, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable,
        "-m",
        "rqcli",
        "preload",
        str(src) + "/",
        "--cache-dir",
        str(cache),
        "--tier",
        "disk",
        *extra,
    ]
    if inject is not None:  # one refused call (when=N, not N+), on the WAL of the index only
        wal = str(cache / "index.sqlite3-wal")
        trace = ["-e", "trace=pwrite64,fdatasync,fsync"]
        cmd = ["strace", "-f", "-qq", "-o", "/dev/null", "-P", wal, *trace, "-e", f"inject={inject}", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize(("call", "error", "code", "words"), CASES)
def test_one_refused_index_write_of_a_new_cache(
    tmp_path: Path, call: str, error: str, code: int, words: str
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(os.urandom(1000))
    when = 2 if call == "pwrite64" else 1  # (past the WAL's header)
    out = _preload(src, tmp_path / "new", f"{call}:error={error}:when={when}")
    assert out.returncode == code, out.stderr
    assert words in out.stderr and "index.sqlite3" in out.stderr, out.stderr
    if error == "EDQUOT":
        assert "no space left on the file system" not in out.stderr, out.stderr


@pytest.mark.parametrize(("call", "error", "code", "words"), CASES[:1])
def test_one_refused_index_write_in_a_run(
    tmp_path: Path, call: str, error: str, code: int, words: str
) -> None:
    """A cache already there: the write refused is a landing's commit, met mid-run."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(os.urandom(1000))
    cache = tmp_path / "cache"
    assert _preload(src, cache, None).returncode == 0
    for name in "bcd":
        (src / name).write_bytes(os.urandom(1000))
    when = 4 if call == "pwrite64" else 1  # (a landing's commit, past the first write of the run)
    out = _preload(src, cache, f"{call}:error={error}:when={when}", "--json")
    assert out.returncode == code, out.stderr + out.stdout
    said = out.stderr + "".join(
        json.loads(line).get("message", "") for line in out.stdout.splitlines() if line.startswith("{")
    )
    assert words in said, said
