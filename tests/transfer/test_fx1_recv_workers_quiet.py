"""`rq recv --workers N --once`: the worker processes its parent stops at the end say nothing; one
that ends on its own is still reported. Real rq send/recv over QUIC on loopback."""

from __future__ import annotations

import os
import select
import signal
import time
from pathlib import Path

import pytest
from xfer_kit import Recv, send, tree_digest, wait_for

pytestmark = pytest.mark.integration


def _children(pid: int) -> list[int]:
    return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def test_a_verified_transfer_ends_workers_once_without_an_error_line(tmp_path: Path) -> None:
    """The parent terminate()d its --once workers, which had not seen the transfer complete (the
    parent had) and each said `rq: error: stopped by SIGTERM before a transfer completed` on the
    shared stderr after a verified transfer, exit 0."""
    src = tmp_path / "ckpt"
    src.mkdir()
    (src / "a.bin").write_bytes(os.urandom(3 << 20))
    (src / "b").write_bytes(b"x" * 100)
    recv = Recv(tmp_path / "dst", tmp_path / "cert", "quic", "--workers", "2", "--once").start()
    try:
        res = send([src], recv, "--connections", "2", "--chunk-size", "1MiB")
        assert res.returncode == 0, res.stderr
        rc, _out, err = recv.wait(60)
    finally:
        recv.kill()
    assert rc == 0, err
    assert "error" not in err, err
    assert tree_digest(tmp_path / "dst" / "ckpt") == tree_digest(src)


def test_a_worker_stopped_by_someone_else_is_still_reported(tmp_path: Path) -> None:
    """A SIGTERM from outside (not the parent's stop) ends a --once worker with its error, and the
    parent says the process died, as before."""
    recv = Recv(tmp_path / "dst", tmp_path / "cert", "quic", "--workers", "2", "--once").start()
    try:
        assert recv.proc is not None
        assert wait_for(lambda: len(_children(recv.proc.pid)) >= 1, 30)  # type: ignore[union-attr]
        os.kill(max(_children(recv.proc.pid)), signal.SIGTERM)
        assert recv.proc.stderr is not None
        seen, fd, end = b"", recv.proc.stderr.fileno(), time.monotonic() + 60
        while b"died" not in seen and select.select([fd], [], [], max(0.0, end - time.monotonic()))[0]:
            data = os.read(fd, 65536)
            if not data:
                break
            seen += data
    finally:
        recv.stop()
    assert b"stopped by SIGTERM before a transfer completed" in seen, seen
    assert b"receiver process (data port" in seen and b"(exit 130)" in seen, seen
