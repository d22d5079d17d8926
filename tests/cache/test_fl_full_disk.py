"""The cache's disk file system full (reviewer's t6/t5): cached data is still served, RAM hits
included, and `rq cache clear` frees the space. Shown on a real small tmpfs in a private mount
namespace: the index's freshness stamp cannot be written, and after a clean close SQLite cannot
even make the index's -shm/-wal to open it for writing."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from cachekit import FILL, unshared

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="needs root and unshare(1) for a mount namespace",
)

SCRIPT = (
    "import json, os, subprocess, sys\n"
    + FILL
    + r"""
from pathlib import Path
from cache import Cache

base = Path(sys.argv[1])
disk, ram = base / "disk", base / "ram"
for d in (disk, ram):
    d.mkdir()
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(disk)], check=True)
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(ram)], check=True)
src = base / "src"
src.mkdir()
data = {f"f{i}": bytes([65 + i]) * 200_000 for i in range(4)}
for name, body in data.items():
    (src / name).write_bytes(body)
cd = disk / "cd"
c = Cache(cd, ram_dir=ram / "root")
c.preload([str(src / "f0"), str(src / "f1")], tier="ram")
c.preload([str(src / "f2"), str(src / "f3")], tier="disk")


def read_all(cache):
    got = {}
    for name, body in data.items():
        try:
            got[name] = cache.read_bytes(str(src / name)) == body
        except Exception as exc:
            got[name] = f"{type(exc).__name__}: {exc}"
    return got

def reopen_and_read():
    try:
        cache = Cache(cd)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    got = read_all(cache)
    cache.close()
    return got

out = {}
fill(disk / "filler")
out["live"] = read_all(c)  # a local origin is revalidated on every open: a stamp to write
c.close()
out["reopen"] = reopen_and_read()
rq = [sys.executable, "-m", "rqcli", "cache"]
run = subprocess.run([*rq, "clear", "--yes", "--cache-dir", str(cd)], capture_output=True)
out["clear"] = [run.returncode, run.stderr.decode()[-300:]]
blobs = [p for p in (cd).rglob("*") if p.is_file() and p.stat().st_size >= 200_000]
blobs += [p for p in (ram / "root").rglob("*") if p.is_file() and p.stat().st_size >= 200_000]
out["blobs_left"] = [str(p) for p in blobs]
(disk / "filler").unlink()
run = subprocess.run([*rq, "verify", "--cache-dir", str(cd)], capture_output=True)
out["verify"] = [run.returncode, run.stderr.decode()[-300:]]
run = subprocess.run([*rq, "ls", "--cache-dir", str(cd)], capture_output=True)
out["ls"] = run.stdout.decode()

# the file system filled after the cache was closed cleanly: no -wal or -shm left, and SQLite
# cannot make them to open the index for writing
c = Cache(cd)
c.preload([str(src / "f0"), str(src / "f1")], tier="ram")
c.preload([str(src / "f2"), str(src / "f3")], tier="disk")
c.close()
fill(disk / "filler")
out["closed_reopen"] = reopen_and_read()
(src / "new").write_bytes(b"N" * 1000)
c = Cache(cd)
try:
    c.read_bytes(str(src / "new"))
    out["closed_miss"] = "served"
except Exception as exc:
    out["closed_miss"] = type(exc).__name__
c.close()
for name in ("du", "ls"):
    run = subprocess.run([*rq, name, "--cache-dir", str(cd)], capture_output=True)
    out[name + "_full"] = [run.returncode, run.stderr.decode()[-300:]]
run = subprocess.run([*rq, "evict", str(src / "f2"), "--cache-dir", str(cd)], capture_output=True)
out["evict_full"] = [run.returncode, run.stderr.decode()[-300:]]
run = subprocess.run([*rq, "clear", "--yes", "--cache-dir", str(cd)], capture_output=True)
out["clear_full"] = [run.returncode, run.stderr.decode()[-300:]]
run = subprocess.run([*rq, "ls", "--cache-dir", str(cd)], capture_output=True)
out["ls_after"] = run.stdout.decode()
(disk / "filler").unlink()
run = subprocess.run([*rq, "verify", "--cache-dir", str(cd)], capture_output=True)
out["verify_after"] = [run.returncode, run.stderr.decode()[-300:]]
print(json.dumps(out))
"""
)


def test_full_disk_serves_and_clears(tmp_path: Path) -> None:
    out = unshared(SCRIPT, tmp_path)
    everything = {name: True for name in ("f0", "f1", "f2", "f3")}
    assert out["live"] == everything, out
    assert out["reopen"] == everything, out
    assert out["clear"][0] == 0, out
    assert out["blobs_left"] == [], out
    assert out["verify"][0] == 0, out
    assert out["ls"].strip() == "", out
    assert out["closed_reopen"] == everything, out
    assert out["closed_miss"] == "CacheFullError", out  # exit 7, not "read-only" (exit 2)
    assert out["du_full"][0] == 0, out
    assert out["ls_full"][0] == 0, out
    assert out["evict_full"][0] == 0, out
    assert out["clear_full"][0] == 0, out
    assert out["ls_after"].strip() == "", out
    assert out["verify_after"][0] == 0, out
