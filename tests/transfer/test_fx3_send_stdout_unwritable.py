"""`rq send` with stdout unwritable (closed, /dev/full) still sends: it goes on without stdout and
exits 1 with the one stderr line naming stdout (docs/cli.md). That line was a bare `cannot write to
stdout: …`, which read as a failed send after the receiver had verified every byte; it now says
the transfer completed, what was sent and that the receiver verified it (as rq recv's line says
what arrived: test_tx_recv_stdout_unwritable.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from xfer_kit import REPO, Recv, rq_cmd, rq_env


@pytest.mark.parametrize("how", ["closed", "full", "full-json"])
def test_send_with_stdout_unwritable_says_the_transfer_completed(tmp_path: Path, how: str) -> None:
    src = tmp_path / "ckpt"
    src.mkdir()
    (src / "a.bin").write_bytes(os.urandom(100_000))
    (src / "b.bin").write_bytes(os.urandom(5_000))
    dest = tmp_path / "dst"
    recv = Recv(dest, tmp_path / "cert", "tcp").start()
    args = rq_cmd("send", str(src), recv.url, *recv.send_args(), *(["--json"] if how == "full-json" else []))
    try:
        with open("/dev/full", "wb") as full:
            if how == "closed":
                kw: dict = {"stdout": subprocess.DEVNULL, "preexec_fn": lambda: os.close(1)}
            else:
                kw = {"stdout": full}
            sent = subprocess.run(
                args, stderr=subprocess.PIPE, env=rq_env(), cwd=REPO, timeout=60, check=False, **kw
            )
    finally:
        recv.stop()
    err = sent.stderr.decode()
    assert (dest / "ckpt" / "a.bin").read_bytes() == (src / "a.bin").read_bytes()
    assert sent.returncode == 1, err  # the documented exit code: stdout unwritable
    why = "Bad file descriptor" if how == "closed" else "No space left on device"
    assert err.splitlines()[-1] == (
        f"rq: error: cannot write to stdout: {why}; the transfer completed all the same: 2 file(s), "
        f"105000 bytes sent to {recv.url} and verified by the receiver, only the report was not written"
    ), err
