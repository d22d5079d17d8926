"""A QUIC sender that heard nothing for PROBE_FOR (1.5 s) at its route's datagram size took the path
for a black hole and sent 1200-byte datagrams for the whole transfer, saying the path was narrower
than the link, also when the silence was the receiver's own: restarted a second late after a kill,
or stopped (a review of the three jobs run together: 23-28 MB/s against 130-460 on loopback). Once
the peer answers at the smaller size, the sender tries the route's size again; here the receiver
is frozen (SIGSTOP) for 2.5 s as the send starts, and the send keeps its size."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from rqtest import freeze
from xfer_kit import REPO, Recv, rq_cmd, rq_env, summary

pytestmark = pytest.mark.integration


def test_a_receiver_silent_at_connect_does_not_narrow_the_datagrams(tmp_path: Path) -> None:
    src = tmp_path / "ckpt.bin"
    src.write_bytes(os.urandom(2 << 20))
    recv = Recv(tmp_path / "dst", tmp_path / "cert", "quic").start()
    try:
        assert recv.proc is not None
        freeze(recv.proc)
        thaw = threading.Timer(2.5, lambda: recv.proc.send_signal(signal.SIGCONT))  # type: ignore[union-attr]
        thaw.start()
        started = time.monotonic()
        sent = subprocess.run(
            rq_cmd("send", str(src), recv.url, *recv.send_args(), "--json"),
            env=rq_env(),
            capture_output=True,
            timeout=120,
            cwd=REPO,
            check=False,
        )
        thaw.join()
        assert time.monotonic() - started >= 2.5  # the probe at the route's size met the silence
        assert sent.returncode == 0, sent.stderr
        assert summary(sent)["verified"]
        assert b'"event":"datagram_size"' not in sent.stdout, sent.stdout
        assert b"no answer at" not in sent.stderr, sent.stderr
    finally:
        recv.stop()
    assert (tmp_path / "dst" / "ckpt.bin").read_bytes() == src.read_bytes()
