"""A connection that stalled before the receiver acknowledged anything on it was given up at
once: the stall detector waits --timeout (120 s by default), longer than --retry-for (60 s), so
the retry loop found its patience spent and never reconnected, though the path had come back
(np: a 90 s partition, or the sender's address changed, exit 6 after 125 s). One reconnect now
follows a stall. Here the receiver is stopped (SIGSTOP) once it wrote its first chunk and woken
just after the stall was declared; --timeout 3 s against --retry-for 2 s stands in for 120
against 60."""

from __future__ import annotations

from pathlib import Path

from xfer_kit import send_while_stopped, summary


def test_a_send_that_stalled_before_its_first_ack_reconnects_once(tmp_path: Path) -> None:
    args = ("--chunk-size", "32M", "--timeout", "3", "--retry-for", "2")
    done = send_while_stopped(tmp_path, "tcp", 32 << 20, 4.0, *args)
    assert done.returncode == 0, done.stderr.decode()[-600:]  # 6 before: "gave up after 3s without progress"
    s = summary(done)
    assert s["verified"] is True and s["attempts"] == 2, done.stderr.decode()[-800:]
    assert (tmp_path / "dst" / "ckpt.bin").stat().st_size == 256 << 20
