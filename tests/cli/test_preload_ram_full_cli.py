"""`rq preload --tier ram` into a RAM tier whose file system others filled: the objects land on disk
(cache 022b507), and the CLI says so — a `demoted` line per object under --json, `demoted_full` in
the summary, and one warning that names the full file system rather than the cap."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from rqtest import random_files, run_rq, small_tmpfs

pytestmark = pytest.mark.integration


def test_preload_into_a_ram_file_system_others_filled_says_where_the_objects_went(tmp_path: Path) -> None:
    src = random_files(tmp_path / "src", 3, 200 << 10, suffix=".bin")
    with small_tmpfs(tmp_path / "shm", "1m") as mnt:
        cache_dir = tmp_path / "cache"
        from cache import Cache

        Cache(cache_dir, ram_dir=mnt / "ram", ram_limit="1G").close()  # the cache, its RAM tier on mnt
        fs = os.statvfs(mnt)
        (mnt / "others.bin").write_bytes(b"x" * (fs.f_bavail * fs.f_frsize - (16 << 10)))
        done = run_rq("preload", str(src), "--cache-dir", str(cache_dir), "--tier", "ram", "--json")
        assert done.returncode == 0, done.stderr.decode()
        lines = [json.loads(x) for x in done.stdout.decode().splitlines()]
        demoted = [x for x in lines if x.get("event") == "demoted"]
        assert len(demoted) == 3 and {x["tier"] for x in demoted} == {"disk"}
        assert lines[-1]["event"] == "summary" and lines[-1]["demoted_full"] == 3
        warning = done.stderr.decode()
        assert "file system under" in warning and "is full" in warning and "--ram-limit" not in warning
