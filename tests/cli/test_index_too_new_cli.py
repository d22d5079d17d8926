"""A cache index made by a newer rq (PRAGMA user_version above what this rq knows) is refused with
one line and exit 10 (unsupported) by every command that opens it, not exit 1."""

from __future__ import annotations

import shutil
import sqlite3
import uuid
from pathlib import Path

import pytest
from rqtest import run_rq

from cache import Cache
from rqcli.exitcodes import ExitCode


@pytest.mark.parametrize("args", [["cache", "ls"], ["cache", "du"], ["preload", "SRC"]])
def test_a_newer_index_is_exit_10_in_one_line(tmp_path: Path, args: list[str]) -> None:
    ram = Path("/dev/shm") / f"rqtest-{uuid.uuid4().hex[:10]}"
    cache_dir = tmp_path / "c"
    Cache(cache_dir, ram_dir=ram).close()
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(b"a")
    try:
        with sqlite3.connect(cache_dir / "index.sqlite3") as db:
            db.execute("PRAGMA user_version = 99")
        argv = [str(src) if a == "SRC" else a for a in args]
        res = run_rq(*argv, "--cache-dir", str(cache_dir))
        err = res.stderr.decode()
        assert res.returncode == ExitCode.UNSUPPORTED, err
        assert "newer than this rq understands" in err and len(err.strip().splitlines()) == 1, err
    finally:
        shutil.rmtree(ram, ignore_errors=True)
