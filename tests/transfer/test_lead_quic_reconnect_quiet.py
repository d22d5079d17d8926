"""A QUIC reconnect that timed out waiting for the receiver's answer left the library's handshake
waiter to fail (ConnectionError) with nobody awaiting it: asyncio printed "Future exception was
never retrieved", the future and "ConnectionError" on stderr, three lines per failed reconnect,
among rq's own warnings (np: a partition mid-send). Here the receiver is stopped (SIGSTOP) once
its first chunk is written, for longer than the idle timeout and one reconnect's wait (10 s each)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from rqtest import freeze
from xfer_kit import Recv, rq_cmd, rq_env, summary


def _bytes_written(pid: int) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise AssertionError("no wchar")


@pytest.mark.slow
def test_failed_quic_reconnects_print_only_rqs_own_lines(tmp_path: Path) -> None:
    src = tmp_path / "ckpt.bin"
    block = os.urandom(1 << 20)
    with open(src, "wb") as fh:
        for _ in range(256):
            fh.write(block)
    recv = Recv(tmp_path / "dst", tmp_path / "cert", "quic", "--once").start()
    assert recv.proc is not None
    proc = recv.proc

    def stop_a_while() -> None:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the `transfer` event
        assert b'"transfer"' in line, line
        start = _bytes_written(proc.pid)
        deadline = time.monotonic() + 30
        while _bytes_written(proc.pid) < start + (16 << 20) and time.monotonic() < deadline:
            time.sleep(0.0005)
        freeze(proc)
        time.sleep(21.0)  # the idle timeout (10 s), then a reconnect that waits 10 s for an answer
        proc.send_signal(signal.SIGCONT)

    stopper = threading.Thread(target=stop_a_while)
    stopper.start()
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
