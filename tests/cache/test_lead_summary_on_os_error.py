"""`rq preload --json` ends with its summary also when the run stops on an error that is not one
of the cache library's own (a bare OSError: the RAM root's tmp/ turned into a file). The run
exited 1 with the error line and an empty stdout, where docs/cli.md promises a summary last."""

from __future__ import annotations

import json
from pathlib import Path

from rqtest import run_rq


def test_an_os_error_still_ends_with_the_summary(
    cache_env: dict[str, str], ram_dir: Path, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"f{i}").write_bytes(b"x" * 10)
    (ram_dir / "tmp").rmdir()
    (ram_dir / "tmp").write_bytes(b"")  # not a directory: no landing can start there
    r = run_rq("--json", "preload", str(src), "--tier", "ram", env=cache_env)
    assert r.returncode == 1, r.stderr.decode()
    lines = [json.loads(line) for line in r.stdout.decode().splitlines()]
    assert lines and lines[-1]["event"] == "summary", r.stdout.decode()
    assert lines[-1]["aborted"] is True and "Not a directory" in lines[-1]["error"]
    assert r.stderr.decode().strip().endswith(lines[-1]["error"])  # the same one line on stderr
