"""rq raises its soft open-files limit to the hard one at start (as Go tools do): under a CI
runner's low soft limit a preload with 256 requests in flight failed objects with EMFILE."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

from rqtest import random_files, rq_command


def test_a_low_soft_open_files_limit_does_not_fail_a_preload(tmp_path: Path) -> None:
    src = random_files(tmp_path / "src", 600, 64)
    rq = shlex.join([*rq_command(), "preload", str(src), "--cache-dir", str(tmp_path / "c"), "--json"])
    done = subprocess.run(
        ["bash", "-c", f"ulimit -Sn 64 && exec {rq}"], capture_output=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr.decode()[-500:]
    summary = json.loads(done.stdout.decode().splitlines()[-1])
    assert summary["objects"] == 600 and summary["failed"] == 0


def test_a_low_hard_open_files_limit_is_named_as_such(tmp_path: Path) -> None:
    """Below the hard limit there is nothing to raise: the error must name the open-files limit,
    not send the user to check --endpoint-url for a local directory (exit 6 before)."""
    src = random_files(tmp_path / "src", 300, 64)
    rq = shlex.join([*rq_command(), "preload", str(src), "--cache-dir", str(tmp_path / "c"), "--json"])
    done = subprocess.run(
        ["bash", "-c", f"ulimit -n 30 && exec {rq}"], capture_output=True, timeout=120, check=False
    )
    err = done.stderr.decode()
    assert done.returncode == 1, err[-500:]
    assert "open files (limit 30)" in err and "ulimit -n" in err and "endpoint" not in err
    summary = json.loads(done.stdout.decode().splitlines()[-1])
    assert summary["aborted"] is True and "open files" in summary["error"]
