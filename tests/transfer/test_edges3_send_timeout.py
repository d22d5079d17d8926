"""`rq send --timeout S` bounds the wait for a receiver that never answers, as curl --connect-timeout
and ssh ConnectTimeout do: a dead address fails within about S, exit 6, over QUIC and TCP.

It did not: --timeout only dropped a stalled connection mid-transfer, so `--timeout 2` to a dead
address still took the 10 s first-connect grace (QUIC: one 10 s handshake; TCP: 10 s of refused
connects; a port that accepts and never answers: 10 s for its first frame). A given --retry-for
still waits for a receiver not up yet (tests/transfer/test_review_edges2.py), each try at most S."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import pytest
from rqtest import silent_server, wait_or_fail
from xfer_kit import REPO, free_port, rq_cmd, rq_env

NO_PIN = "sha256:" + "0" * 64  # nothing answers to check it against


def _send(src: Path, url: str, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        rq_cmd("send", str(src), url, "--json", *extra),
        env=rq_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
    )


def _last(proc: subprocess.Popen[bytes]) -> dict[str, object]:
    out, _ = proc.communicate(timeout=10)
    return dict(json.loads(out.decode().splitlines()[-1]))


@pytest.mark.parametrize("transport", ["tcp", "quic"])
def test_a_short_timeout_gives_up_on_a_dead_address_within_it(tmp_path: Path, transport: str) -> None:
    src = tmp_path / "a.bin"
    src.write_bytes(b"x" * 1000)
    if transport == "quic":
        port, extra = free_port(socket.SOCK_DGRAM), ("--pin", NO_PIN)
    else:
        port, extra = free_port(), ()
    proc = _send(src, f"rq://127.0.0.1:{port}", "--transport", transport, "--timeout", "0.5", *extra)
    # 0.5 s asked; the old code took the 10 s grace whatever --timeout said
    rc = wait_or_fail(proc, 8, "still trying a dead address long after --timeout 0.5")
    summary = _last(proc)
    assert rc == 6, summary
    assert summary["event"] == "summary" and summary["complete"] is False, summary


def test_a_short_timeout_gives_up_on_a_port_that_never_answers(tmp_path: Path) -> None:
    # TCP connects (a hung receiver, a half-dead port-forward): the wait is for its first frame
    src = tmp_path / "a.bin"
    src.write_bytes(b"x" * 1000)
    with silent_server() as port:
        proc = _send(src, f"rq://127.0.0.1:{port}", "--transport", "tcp", "--timeout", "0.5")
        rc = wait_or_fail(proc, 8, "still waiting for a silent port long after --timeout 0.5")
    summary = _last(proc)
    assert rc == 6, summary


def test_a_given_retry_for_still_waits_for_a_receiver_not_up_yet(tmp_path: Path) -> None:
    # --timeout bounds each try, a given --retry-for how long to keep trying: CI starts the sender
    # first (that it then finishes: tests/transfer/test_review_edges2.py)
    src = tmp_path / "a.bin"
    src.write_bytes(b"x" * 1000)
    port = free_port()
    proc = _send(src, f"rq://127.0.0.1:{port}", "--transport", "tcp", "--timeout", "0.5", "--retry-for", "30")
    try:
        assert proc.stdout is not None
        retries = 0
        while retries < 4:  # 0.2 + 0.4 + 0.8 s of back-off at least: well past the 0.5 s timeout
            line = proc.stdout.readline()
            assert line, proc.communicate(timeout=10)[1].decode()
            event = json.loads(line)
            assert event["event"] != "summary", event  # it gave up
            retries += event["event"] == "retry"
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
