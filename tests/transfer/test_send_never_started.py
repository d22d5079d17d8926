"""A send that never started: nothing to resume, and a name that does not resolve is said at once.

A host name that did not resolve ("[Errno -3] Temporary failure in name resolution") was retried
for the whole first-connect grace (10 s) as if the receiver were down, then blamed on it: "is `rq
recv` running there? re-run the same command to resume", though nothing had been sent to resume."""

from __future__ import annotations

import time
from pathlib import Path

from rqtest import popen_rq_with, run_rq
from xfer_kit import free_port, rq_env


def test_unresolvable_host_fails_at_once_naming_it(tmp_path: Path) -> None:
    """Refused before any attempt. Inside rq a receiver that never answered is tried for 300 s
    (FIRST_CONNECT_GRACE; --retry-for's default 60 s caps it), so a send that retried the name as if
    it were transient would take a minute; ending well inside that (start-up and one DNS lookup on
    a loaded runner included) is the at-once path."""
    src = tmp_path / "a.bin"
    src.write_bytes(b"x" * 1000)
    started = time.monotonic()
    proc = popen_rq_with(
        "import transfer.sender\ntransfer.sender.FIRST_CONNECT_GRACE = 300.0",
        "send",
        str(src),
        "rq://no-such-host.invalid:7420",
        "--transport",
        "tcp",
        env={**rq_env(), "CI": "1"},
    )
    try:
        _out, raw = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    took = time.monotonic() - started
    err = raw.decode()
    assert proc.returncode == 6, err
    assert "cannot resolve no-such-host.invalid" in err, err
    assert "running there" not in err and "resume" not in err, err
    assert took < 30, f"took {took:.1f} s: retried as if transient"


def test_nothing_listening_says_nothing_of_resuming(tmp_path: Path) -> None:
    src = tmp_path / "a.bin"
    src.write_bytes(b"x" * 1000)
    port = free_port()
    proc = run_rq(
        "send",
        str(src),
        f"rq://127.0.0.1:{port}",
        "--transport",
        "tcp",
        "--retry-for",
        "0.3",
        env=rq_env(),
        timeout=30,
    )
    err = proc.stderr.decode()
    assert proc.returncode == 6, err
    assert "is `rq recv` running there" in err and "resume" not in err, err
