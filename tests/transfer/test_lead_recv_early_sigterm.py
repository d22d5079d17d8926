"""SIGTERM stops `rq recv` (without --once) with exit 0, the normal way a receiver ends
(docs/transfer.md). One that came while rq was still starting, before `rq recv` had its own
handler, was exit 130, "stopped by SIGTERM": a service manager that started a receiver and stopped
it at once saw a failure (a review of the three jobs run together). Here SIGTERM is sent as soon
as rq holds it (its start-up handler is in place), well before the receiver listens."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from rqtest import popen_rq
from xfer_kit import rq_env


def _catches_sigterm(pid: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)) != 0
    return False


@pytest.mark.parametrize(
    ("once", "code"),
    [("", 0), ("--once", 130), ("config", 130), ("config false", 0), ("env", 130), ("config, env 0", 0)],
)
def test_sigterm_while_rq_recv_starts(tmp_path: Path, once: str, code: int) -> None:
    """`once` says how --once is given: the option, the config file's [recv] once (true, or
    false), RQ_RECV_ONCE (which beats the config file, dr3); none: a receiver that ends the normal way."""
    config = tmp_path / "config.toml"
    config.write_text(f"[recv]\nonce = {'false' if once == 'config false' else 'true'}\n")
    env = (
        rq_env(RQ_RECV_ONCE="1")
        if once == "env"
        else rq_env(RQ_RECV_ONCE="0")
        if "env 0" in once
        else rq_env()
    )
    front = ["--config", str(config)] if once.startswith("config") else ["--config", "/dev/null"]
    args = ["recv", str(tmp_path / "dst"), "--listen", "127.0.0.1:0", "--cert-dir", str(tmp_path / "cert")]
    proc = popen_rq(*front, *args, *(["--once"] if once == "--once" else []), env=env)
    deadline = time.monotonic() + 30
    while not _catches_sigterm(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.001)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == code, err
    if code == 0:
        assert b"stopped by SIGTERM" not in err, err
