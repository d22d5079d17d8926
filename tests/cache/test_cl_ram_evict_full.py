"""Evicting a RAM-tier entry while the index's file system is full: the RAM file was unlinked first
(it frees nothing there), the row could not be deleted, and the entry was left half-evicted: exit 7,
then `rq cache verify` called it corrupt ("missing file", exit 5). Now both stay (exit 7, the
documented full-disk error) and a later evict, with space, removes both. Shown on small tmpfs
mounts in a private mount namespace, as tests/cache/test_fl_full_disk.py does."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="needs root and unshare(1) for a mount namespace",
)

SCRIPT = r"""
import json, os, subprocess, sys
from pathlib import Path
from cache import Cache

base = Path(sys.argv[1])
disk, ram, src = base / "disk", base / "ram", base / "src"
for d in (disk, ram, src):
    d.mkdir()
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(disk)], check=True)
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(ram)], check=True)
(src / "r0").write_bytes(b"R" * 200_000)
cd = disk / "cd"
c = Cache(cd, ram_dir=ram / "root")
c.preload([str(src / "r0")], tier="ram")
c.close()
fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
for size in (1 << 20, 4096, 512, 1):
    try:
        while True:
            os.write(fd, b"\0" * size)
    except OSError:
        pass
os.close(fd)
rq = [sys.executable, "-m", "rqcli", "cache"]

def run(*args):
    r = subprocess.run([*rq, *args, "--cache-dir", str(cd)], capture_output=True)
    return [r.returncode, r.stdout.decode(), r.stderr.decode()[-300:]]

def ram_files():
    return [p.name for p in (ram / "root").rglob("*") if p.is_file() and p.stat().st_size == 200_000]

out = {"evict_full": run("evict", str(src / "r0")), "files_full": ram_files()}
out["verify_full"] = run("verify")
(disk / "filler").unlink()
out["verify"] = run("verify")
out["evict"] = run("evict", str(src / "r0"))
out["files"] = ram_files()
out["ls"] = run("ls")
print(json.dumps(out))
"""


def test_ram_entry_evicted_on_full_disk_is_kept_whole(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    run = subprocess.run(
        ["unshare", "-m", "--propagation", "private", sys.executable, "-c", SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=str(root),
    )
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["evict_full"][0] == 7 and "no space left" in out["evict_full"][2], out
    assert len(out["files_full"]) == 1, out  # the data kept with its row
    assert out["verify_full"][0] == 0 and "0 corrupt" in out["verify_full"][1], out
    assert out["verify"][0] == 0 and "0 corrupt" in out["verify"][1], out
    assert out["evict"][0] == 0, out
    assert out["files"] == [] and out["ls"][1] == "", out  # both gone once there is space
