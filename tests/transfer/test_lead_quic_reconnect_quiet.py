"""A QUIC reconnect that timed out waiting for the receiver's answer left the library's handshake
waiter to fail (ConnectionError) with nobody awaiting it: asyncio printed "Future exception was
never retrieved", the future and "ConnectionError" on stderr, three lines per failed reconnect,
among rq's own warnings (np: a partition mid-send). Here the receiver is stopped (SIGSTOP) once
its first chunk is written, for longer than the idle timeout and one reconnect's wait (10 s each)."""

from __future__ import annotations

from pathlib import Path

import pytest
from xfer_kit import send_while_stopped, summary


@pytest.mark.slow
def test_failed_quic_reconnects_print_only_rqs_own_lines(tmp_path: Path) -> None:
    done = send_while_stopped(tmp_path, "quic", 16 << 20, 21.0, "--chunk-size", "8M", "--retry-for", "60")
    err = done.stderr.decode()
    assert done.returncode == 0, err[-800:]
    assert summary(done)["verified"] is True
    assert "no answer within" in done.stdout.decode()  # a reconnect did time out while it was stopped
    assert "never retrieved" not in err and "ConnectionError" not in err, err
    assert all(line.startswith("rq: ") for line in err.splitlines() if line.strip()), err
