"""Evictions that cannot finish leave the entry whole, its data and its row, and say so.

Evicting a RAM-tier entry while the index's file system is full: the RAM file was unlinked first
(it frees nothing there), the row could not be deleted, and the entry was left half-evicted: exit 7,
then `rq cache verify` called it corrupt ("missing file", exit 5). Now both stay (exit 7, the
documented full-disk error) and a later evict, with space, removes both.

`rq cache evict`/`clear` of an entry whose file cannot be removed (its RAM root read-only): the row
was deleted first and the file and an `evicting` hold stayed behind, so the entry vanished from
`ls` while its bytes stayed, and every later `rq cache verify` failed on that hold (exit 1,
"Read-only file system"). Now the entry goes back as it was and the error is reported (exit 1).

Both on small tmpfs mounts in a private mount namespace, as tests/cache/test_fl_full_disk.py does."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from cachekit import FILL, unshared

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="needs root and unshare(1) for a mount namespace",
)

HEAD = (
    "import json, os, subprocess, sys\n"
    + FILL
    + r"""
from pathlib import Path
from cache import Cache

base = Path(sys.argv[1])
ram, src, cd = base / "ram", base / "src", base / "disk" / "cd"
for d in (ram, src, cd.parent):
    d.mkdir()
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(ram)], check=True)
rq = [sys.executable, "-m", "rqcli", "cache"]

def run(*args):
    r = subprocess.run([*rq, *args, "--cache-dir", str(cd)], capture_output=True)
    return [r.returncode, r.stdout.decode(), r.stderr.decode()[-300:]]

def ram_files():
    return [p.name for p in (ram / "root").rglob("*") if p.is_file() and p.stat().st_size >= 1000]
"""
)


FULL_DISK = r"""
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(cd.parent)], check=True)
(src / "r0").write_bytes(b"R" * 200_000)
c = Cache(cd, ram_dir=ram / "root")
c.preload([str(src / "r0")], tier="ram")
c.close()
fill(cd.parent / "filler")
out = {"evict_full": run("evict", str(src / "r0")), "files_full": ram_files()}
out["verify_full"] = run("verify")
(cd.parent / "filler").unlink()
out["verify"] = run("verify")
out["evict"] = run("evict", str(src / "r0"))
out["files"] = ram_files()
out["ls"] = run("ls")
print(json.dumps(out))
"""


def test_ram_entry_evicted_on_full_disk_is_kept_whole(tmp_path: Path) -> None:
    out = unshared(HEAD + FULL_DISK, tmp_path)
    assert out["evict_full"][0] == 7 and "no space left" in out["evict_full"][2], out
    assert len(out["files_full"]) == 1, out  # the data kept with its row
    assert out["verify_full"][0] == 0 and "0 corrupt" in out["verify_full"][1], out
    assert out["verify"][0] == 0 and "0 corrupt" in out["verify"][1], out
    assert out["evict"][0] == 0, out
    assert out["files"] == [] and out["ls"][1] == "", out  # both gone once there is space


READ_ONLY_RAM = r"""
for name in ("a", "b"):
    (src / name).write_bytes(name.encode() * 1000)
c = Cache(cd, ram_dir=ram / "root")
c.preload([str(src)], tier="ram")
c.close()
subprocess.run(["mount", "-o", "remount,ro", str(ram)], check=True)
out = {"evict": run("evict", str(src / "a")), "ls": run("ls"), "verify": run("verify")}
out["clear"] = run("clear", "--yes")
out["ls_after"] = run("ls")
out["files"] = ram_files()
out["du"] = run("du", "--json")
print(json.dumps(out))
"""


def test_an_entry_whose_file_cannot_go_stays_whole(tmp_path: Path) -> None:
    out = unshared(HEAD + READ_ONLY_RAM, tmp_path)
    assert out["evict"][0] == 1 and "Read-only file system" in out["evict"][2], out
    assert len(out["ls"][1].splitlines()) == 2, out  # `a` still listed: its file is still there
    assert out["verify"][0] == 0 and "0 corrupt" in out["verify"][1], out
    assert out["clear"][0] == 1, out
    assert len(out["ls_after"][1].splitlines()) == 2 and len(out["files"]) == 2, out
    ram = json.loads(out["du"][1].splitlines()[0])["ram"]
    assert out["du"][0] == 0 and ram["objects"] == 2 and ram["held"] == 0, out
