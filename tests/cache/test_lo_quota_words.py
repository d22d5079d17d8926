"""A landing refused for a disk quota used up (EDQUOT) was said "no space left on the file system
under …" in its {"event":"failed"} line (--json) and in the per-object warning, as a full disk is:
the file system has room, and freeing it is not what helps. EDQUOT now says "disk quota exceeded"
(the final error line and exit 7 as before), ENOSPC still "no space left on the file system".
Real fault: strace refuses the publishing link of one object with the errno."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from cachekit import preload_disk_cmd

pytestmark = pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")


def _preload(
    src: Path, cache: Path, *extra: str, refuse: tuple[str, Path] | None = None
) -> subprocess.CompletedProcess[str]:
    cmd = preload_disk_cmd(src, cache, *extra)
    if refuse is not None:  # link(2) onto that one path refused, every time
        error, path = refuse
        cmd = [
            "strace",
            "-f",
            "-qq",
            "-o",
            "/dev/null",
            "-P",
            str(path),
            "-e",
            "trace=link",
            "-e",
            f"inject=link:error={error}:when=1+",
            *cmd,
        ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize(
    ("error", "said", "not_said"),
    [
        ("EDQUOT", "disk quota exceeded", "on the file system"),
        ("ENOSPC", "no space left on the file system", "disk quota"),
    ],
)
def test_a_quota_is_said_as_one_per_object(tmp_path: Path, error: str, said: str, not_said: str) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in "abc":
        (src / name).write_bytes(os.urandom(100_000))
    first = tmp_path / "first"
    assert _preload(src, first).returncode == 0
    blob = next(first.glob("objects/*/*-b")).relative_to(first)  # (the same in any cache: URL and version)
    for extra in (("--json",), ()):
        cache = tmp_path / f"cache{len(extra)}"
        out = _preload(src, cache, *extra, refuse=(error, cache / blob))
        assert out.returncode == 7, out.stderr + out.stdout
        if extra:
            failed = [json.loads(line) for line in out.stdout.splitlines() if '"failed"' in line]
            failed = [f for f in failed if f.get("event") == "failed"]
            assert len(failed) == 1 and failed[0]["kind"] == "no_space", out.stdout
            assert said in failed[0]["message"] and not_said not in failed[0]["message"], failed[0]
        else:
            warning = [line for line in out.stderr.splitlines() if line.startswith("rq: warning:")]
            assert len(warning) == 1 and said in warning[0] and not_said not in warning[0], out.stderr
        assert said in out.stderr.splitlines()[-1], out.stderr
