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


def test_running_out_of_open_files_is_named_as_such() -> None:
    """Where the library still gives up on EMFILE (it backs off first: a4f49d1), the error must
    name the open-files limit, not send the user to check --endpoint-url for a local directory
    (exit 6 before)."""
    import errno

    from cache.errors import UnreachableError
    from rqcli.commands.preload import cache_error_to_cli
    from rqcli.exitcodes import ExitCode

    try:
        try:
            raise OSError(errno.EMFILE, "Too many open files", "/data/f118")
        except OSError as cause:
            raise UnreachableError("cannot open /data/f118: Too many open files") from cause
    except UnreachableError as exc:
        err = cache_error_to_cli(exc)
    line = err.one_line()
    assert err.code == ExitCode.FAILURE
    assert "ran out of open files (limit " in line and "ulimit -n" in line and "endpoint" not in line
