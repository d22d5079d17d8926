"""A directory origin on a network or FUSE file system that went away (sshfs, s3fs or gcsfuse whose
daemon died; an NFS server down): every access says ENOTCONN, ETIMEDOUT or EHOSTDOWN. That is the
origin not answering, as for a store that cannot be reached (UnreachableError, exit 6, "re-run to
continue"), not an unexplained error (exit 1). Shown on a real dead FUSE mount: /dev/fuse opened,
mounted, and closed again without a daemon ever answering, inside a private mount namespace."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists("/dev/fuse") or shutil.which("unshare") is None,
    reason="needs root, /dev/fuse and unshare(1) for a mount namespace",
)

SCRIPT = r"""
import ctypes, json, os, subprocess, sys
from pathlib import Path
from cache import Cache
from cache.errors import CacheError

base = Path(sys.argv[1])
src = base / "src"
src.mkdir()
(src / "a").write_bytes(b"A" * 100)
c = Cache(base / "c", ram_dir=base / "ram")
c.preload([str(src)])
fd = os.open("/dev/fuse", os.O_RDWR)
libc = ctypes.CDLL(None, use_errno=True)
opts = f"fd={fd},rootmode=40000,user_id=0,group_id=0".encode()
if libc.mount(b"rq-dead", str(src).encode(), b"fuse", 0, opts) != 0:
    print(json.dumps({"skip": os.strerror(ctypes.get_errno())}))
    sys.exit(0)
os.close(fd)  # its daemon is gone: every access to src is ENOTCONN from now on
out = {}
try:
    c.read_bytes(str(src / "a"))
    out["open"] = "served"
except CacheError as exc:
    out["open"] = type(exc).__name__
c.close()
rq = [sys.executable, "-m", "rqcli"]
for name, args in (
    ("cat", ["cache", "cat", str(src / "b")]),  # not cached: only the origin could answer
    ("cat_cached", ["cache", "cat", str(src / "a")]),
    ("preload", ["preload", str(src)]),
):
    run = subprocess.run([*rq, *args, "--cache-dir", str(base / "c")], capture_output=True)
    out[name] = [run.returncode, run.stderr.decode()]
print(json.dumps(out))
"""


def test_an_origin_whose_mount_went_away_is_unreachable(tmp_path: Path) -> None:
    cmd = ["unshare", "-m", "--propagation", "private", sys.executable, "-c", SCRIPT, str(tmp_path)]
    run = subprocess.run(cmd, capture_output=True, timeout=120, env={**os.environ, "CI": "1"})
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.decode().splitlines()[-1])
    if "skip" in out:
        pytest.skip(f"cannot mount FUSE here: {out['skip']}")
    # was: CacheError "cannot stat …: Transport endpoint is not connected", and exit 1 for both
    assert out["open"] == "served"  # the verified cached copy, as when an S3 store is down
    for name in ("cat", "preload"):
        code, err = out[name]
        assert code == 6, (name, err)
        assert "Transport endpoint is not connected" in err and err.count("\n") == 1, err
    assert "is mounted" in out["preload"][1] and "--endpoint-url" not in out["preload"][1]
    code, err = out["cat_cached"]
    assert code == 0 and "served the cached copy" in err, err
