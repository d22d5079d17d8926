"""`rq preload --tier ram` into a RAM file system smaller than the RAM cap, filled by rq's own
entries (reviewer's t1: a 12 MiB tmpfs, --ram-limit 100M): the warning for the objects that went to
disk blamed "files that are not rq's". It says what the index says the tier holds against the
file system's size, and that the cap is above what the file system holds. Shown on a real tmpfs in
a private mount namespace."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from cachekit import unshared

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("unshare") is None,
        reason="needs root and unshare(1) for a mount namespace",
    ),
]

SCRIPT = r"""
import json, subprocess, sys
from pathlib import Path

base = Path(sys.argv[1])
ram, src = base / "ram", base / "src"
ram.mkdir()
src.mkdir()
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(ram)], check=True)
for i in range(10):
    (src / f"f{i}").write_bytes(bytes([65 + i]) * (1 << 20))
cd = base / "c"
subprocess.run(
    [sys.executable, "-c", "import sys; from cache import Cache; Cache(sys.argv[1], ram_dir=sys.argv[2]).close()",
     str(cd), str(ram / "root")],
    check=True,
)
run = subprocess.run(
    [sys.executable, "-m", "rqcli", "preload", str(src), "--cache-dir", str(cd), "--tier", "ram",
     "--ram-limit", "100M"],
    capture_output=True,
)
print(json.dumps([run.returncode, run.stderr.decode()]))
"""


def test_warning_names_the_tiers_own_entries(tmp_path: Path) -> None:
    rc, stderr = unshared(SCRIPT, tmp_path)
    assert rc == 0, stderr
    assert "in the disk tier" in stderr, stderr
    assert "not rq's" not in stderr, stderr
    assert "--ram-limit" in stderr, stderr
