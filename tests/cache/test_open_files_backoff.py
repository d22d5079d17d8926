"""A preload under a low hard open-files limit backs off and goes on with fewer in flight, as it
does for a store that throttles: EMFILE opening a source file, a temp file, or the cache dir for
syncfs stopped the run (exit 1, 'the process ran out of open files') or failed objects one by one."""

from __future__ import annotations

import json
import resource
import subprocess
from pathlib import Path

import pytest
from rqtest import random_files, rq_command

from cache import Cache


@pytest.mark.parametrize("limit", [40, 20])
def test_a_preload_under_a_low_open_files_limit_lands_everything(tmp_path: Path, limit: int) -> None:
    src = random_files(tmp_path / "src", 300, 64)

    def low_limit() -> None:  # soft and hard: rq cannot raise it
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    done = subprocess.run(
        [*rq_command(), "preload", str(src), "--cache-dir", str(tmp_path / "c"), "--json"],
        preexec_fn=low_limit, capture_output=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()[-500:]
    assert json.loads(done.stdout.decode().splitlines()[-1])["objects"] == 300
    with Cache(tmp_path / "c") as c:
        assert len(c.entries()) == 300
        assert c.verify()[1] == []
