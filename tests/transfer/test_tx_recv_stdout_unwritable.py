"""`rq recv` with stdout unwritable (closed, /dev/full) still receives: the data is its job. It then
exits 1 with the one stderr line naming stdout (docs/cli.md), and that line says the transfer arrived
whole: it used to be a bare `cannot write to stdout: …`, which read as a failed transfer."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest
from xfer_kit import REPO, free_port, rq_cmd, rq_env, wait_for


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("how", ["closed", "full"])
def test_recv_with_stdout_unwritable_says_the_data_arrived(tmp_path: Path, how: str) -> None:
    src = tmp_path / "ckpt"
    src.mkdir()
    (src / "a.bin").write_bytes(os.urandom(100_000))
    dest = tmp_path / "dst"
    port = free_port()
    args = rq_cmd("recv", str(dest), "--listen", f"127.0.0.1:{port}", "--transport", "tcp", "--once")
    args += ["--cert-dir", str(tmp_path / "cert")]
    with open("/dev/full", "wb") as full:
        if how == "closed":
            kw: dict = {"stdout": subprocess.DEVNULL, "preexec_fn": lambda: os.close(1)}
        else:
            kw = {"stdout": full}
        recv = subprocess.Popen(args, stderr=subprocess.PIPE, env=rq_env(), cwd=REPO, **kw)
        try:
            assert wait_for(lambda: _listening(port) or recv.poll() is not None, 30)
            sent = subprocess.run(
                rq_cmd("send", str(src), f"rq://127.0.0.1:{port}", "--transport", "tcp"),
                env=rq_env(),
                capture_output=True,
                timeout=60,
                cwd=REPO,
                check=False,
            )
            assert sent.returncode == 0, sent.stderr
            _, err = recv.communicate(timeout=30)
        finally:
            if recv.poll() is None:
                recv.kill()
                recv.wait()
    assert (dest / "ckpt" / "a.bin").read_bytes() == (src / "a.bin").read_bytes()
    assert recv.returncode == 1, err
    last = err.decode().splitlines()[-1]
    why = "Bad file descriptor" if how == "closed" else "No space left on device"
    assert last == (
        f"rq: error: cannot write to stdout: {why}; 1 transfer(s) were received and verified into "
        f"{dest} all the same, only the report was not written"
    ), last
