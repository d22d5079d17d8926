"""A connection that stalled before the receiver acknowledged anything on it was given up at
once: the stall detector waits --timeout (120 s by default), longer than --retry-for (60 s), so
the retry loop found its patience spent and never reconnected, though the path had come back
(np: a 90 s partition, or the sender's address changed, exit 6 after 125 s). One reconnect now
follows a stall. Here the receiver is stopped (SIGSTOP) once it wrote its first chunk and woken
just after the stall was declared; --timeout 3 s against --retry-for 2 s stands in for 120
against 60."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

from rqtest import freeze
from xfer_kit import Recv, rq_cmd, rq_env, summary


def _bytes_written(pid: int) -> int:
    """What process `pid` has written so far (wchar: its chunks into the .part)."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise AssertionError("no wchar")


def test_a_send_that_stalled_before_its_first_ack_reconnects_once(tmp_path: Path) -> None:
    src = tmp_path / "ckpt.bin"
    block = os.urandom(1 << 20)
    with open(src, "wb") as fh:
        for _ in range(256):
            fh.write(block)
    recv = Recv(tmp_path / "dst", tmp_path / "cert", "tcp", "--once").start()
    assert recv.proc is not None
    proc = recv.proc

    def stop_when_chunks_flow() -> None:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the `transfer` event: planned, chunks about to flow
        assert b'"transfer"' in line, line
        start = _bytes_written(proc.pid)
        deadline = time.monotonic() + 30
        while _bytes_written(proc.pid) < start + (32 << 20) and time.monotonic() < deadline:
            time.sleep(0.0005)
        freeze(proc)  # (its first ACK comes after 8 chunks of 32 MiB, the whole file: far off)
        time.sleep(4.0)  # past the 3 s stall, before the retry gives up
        proc.send_signal(signal.SIGCONT)

    stopper = threading.Thread(target=stop_when_chunks_flow)
    stopper.start()
    try:
        done = subprocess.run(
            rq_cmd(
                "send", str(src), recv.url, *recv.send_args(), "--json", "--compress", "none",
                "--chunk-size", "32M", "--timeout", "3", "--retry-for", "2",
            ),
            env=rq_env(), capture_output=True, timeout=120, check=False,
        )  # fmt: skip
    finally:
        stopper.join()
        recv.stop()
    assert done.returncode == 0, done.stderr.decode()[-600:]  # 6 before: "gave up after 3s without progress"
    s = summary(done)
    assert s["verified"] is True and s["attempts"] == 2, done.stderr.decode()[-800:]
    assert (tmp_path / "dst" / "ckpt.bin").stat().st_size == 256 << 20
