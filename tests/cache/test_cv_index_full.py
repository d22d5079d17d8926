"""A new cache whose index cannot be written for want of space exited 1 ("cannot use the cache index
…: database or disk is full", or "disk I/O error" for a quota used up) where a full file system is
exit 7; and EDQUOT was worded "no space left on the file system". Both now exit 7, the quota named
as such. The write errors are injected with strace (pwrite64, SQLite's writes)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")


@pytest.mark.parametrize(("error", "words"), [("ENOSPC", "no space left"), ("EDQUOT", "disk quota")])
def test_a_full_file_system_under_a_new_index_is_exit_7(tmp_path: Path, error: str, words: str) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(os.urandom(1000))
    new = tmp_path / "new"
    out = subprocess.run(
        [
            "strace", "-f", "-qq", "-o", "/dev/null", "-e", f"inject=pwrite64:error={error}:when=5+",
            sys.executable, "-m", "rqcli", "preload", str(src) + "/", "--cache-dir", str(new), "--tier", "disk",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )  # fmt: skip
    assert out.returncode == 7, out.stderr
    assert words in out.stderr and "index.sqlite3" in out.stderr, out.stderr
    if error == "EDQUOT":
        assert "quota" in out.stderr.split("—", 1)[1]  # the hint too
