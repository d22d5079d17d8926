"""A disk tier whose file system runs out of inodes, not bytes (a tmpfs with a small nr_inodes,
reviewer fs): `rq preload` exits 7 as for a full disk, and its line and hint say inodes, with
`df -i`, instead of advising a lower --disk-limit, which frees none. Old code: "no space left …
lower --ram-limit/--disk-limit below its free space". Shown on a real tmpfs in a private mount
namespace."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from cachekit import unshared

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="needs root and unshare(1) for a mount namespace",
)

SCRIPT = r"""
import json, os, subprocess, sys
from pathlib import Path

base = Path(sys.argv[1])
disk = base / "disk"
disk.mkdir()
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m,nr_inodes=40", "tmpfs", str(disk)], check=True)
src = base / "src"
src.mkdir()
for i in range(40):
    (src / f"f{i:02d}").write_bytes(bytes([i]) * 1000)
run = subprocess.run(
    [sys.executable, "-c", "import sys; sys.argv[0] = 'rq'; from rqcli.console import main; main()",
     "preload", str(src) + "/", "--tier", "disk", "--cache-dir", str(disk / "c")],
    capture_output=True, text=True, timeout=60,
)
print(json.dumps({"rc": run.returncode, "err": run.stderr}))
"""


def test_out_of_inodes_is_said_and_the_hint_fits(tmp_path: Path) -> None:
    got = unshared(SCRIPT, tmp_path)
    assert got["rc"] == 7, got
    assert "out of inodes" in got["err"] and "df -i" in got["err"], got["err"]
    assert "--disk-limit below" not in got["err"], got["err"]
