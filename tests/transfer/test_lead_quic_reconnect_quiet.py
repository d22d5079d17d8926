"""A QUIC reconnect that timed out waiting for the receiver's answer left the library's handshake
waiter to fail (ConnectionError) with nobody awaiting it: asyncio printed "Future exception was
never retrieved", the future and "ConnectionError" on stderr, three lines per failed reconnect,
among rq's own warnings (np: a partition mid-send). Here the receiver is stopped (SIGSTOP) once
its first chunk is written, for longer than the idle timeout and one reconnect's wait (10 s each)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from xfer_kit import Recv, repeated_random_file, rq_cmd, rq_env, stop_once_writing, summary


@pytest.mark.slow
def test_failed_quic_reconnects_print_only_rqs_own_lines(tmp_path: Path) -> None:
    src = repeated_random_file(tmp_path / "ckpt.bin", 256)
    recv = Recv(tmp_path / "dst", tmp_path / "cert", "quic", "--once").start()
    stopper = stop_once_writing(recv, 16 << 20, hold=21.0)
    try:
        done = subprocess.run(
            rq_cmd(
                "send", str(src), recv.url, *recv.send_args(), "--json", "--compress", "none",
                "--chunk-size", "8M", "--retry-for", "60",
            ),
            env=rq_env(), capture_output=True, timeout=120, check=False,
        )  # fmt: skip
    finally:
        stopper.join()
        recv.stop()
    err = done.stderr.decode()
    assert done.returncode == 0, err[-800:]
    assert summary(done)["verified"] is True
    assert "no answer within" in done.stdout.decode()  # a reconnect did time out while it was stopped
    assert "never retrieved" not in err and "ConnectionError" not in err, err
    assert all(line.startswith("rq: ") for line in err.splitlines() if line.strip()), err
