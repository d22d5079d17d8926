"""A real I/O error on the cache index (EIO on one write into its WAL, injected by strace) is exit 1
with SQLite's "disk I/O error" and the index named: not taken for a full disk (exit 7) by the
free-space and probe checks that tell a lasting ENOSPC/EDQUOT (a one-off ENOSPC/EDQUOT that has
passed by then is reported the same way: docs/cache.md). Real SQLite, real fault."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from cachekit import preload_disk_cmd

pytestmark = pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")

CASES = [("pwrite64", "EIO", 1, "disk I/O error")]


def _preload(src: Path, cache: Path, inject: str | None, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = preload_disk_cmd(src, cache, *extra)
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
