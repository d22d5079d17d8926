"""What `rq send` tells a script when it stops before the end (review of the docs against
behaviour, 2026-11-23): the --json output still ends with its summary, a receiver that stops
answering is dropped instead of waited on for ever, the exit code says whether a re-run resumes,
and --tls on one side only is named as such."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from xfer_kit import (
    REPO,
    Recv,
    Relay,
    interrupt_mid_send,
    journal_records,
    rq_cmd,
    rq_env,
    send,
    summary,
    wait_for,
)

from rqcli.exitcodes import ExitCode


@pytest.fixture
def receivers() -> Iterator[list[Recv]]:
    """Receivers a test starts; stopped whatever the test's outcome (a stopped one is woken first)."""
    started: list[Recv] = []
    yield started
    for r in started:
        if r.proc is not None and r.proc.poll() is None:
            r.proc.send_signal(signal.SIGCONT)
        r.stop()


def _big_file(tmp_path: Path, mib: int = 300) -> Path:
    src = tmp_path / "big.bin"
    with open(src, "wb") as fh:
        for _ in range(mib):
            fh.write(os.urandom(1 << 20))
    return src


def test_a_receiver_that_stops_answering_is_dropped_and_the_send_ends_resumable(
    tmp_path: Path, receivers: list[Recv]
) -> None:
    src = _big_file(tmp_path)
    recv = Recv(tmp_path / "dest", tmp_path / "cert").start()
    receivers.append(recv)
    assert recv.proc is not None
    proc = subprocess.Popen(
        rq_cmd(
            "send",
            str(src),
            recv.url,
            *recv.send_args(),
            "--json",
            "--chunk-size",
            "1M",
            "--timeout",
            "2",
            "--retry-for",
            "1",
        ),
        env=rq_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
    )
    try:
        # a few batches journalled, so the sender has heard ACKs (not only the receiver written them)
        assert wait_for(lambda: journal_records(tmp_path / "dest") > 24, 30, step=0.005)
        recv.proc.send_signal(signal.SIGSTOP)  # stopped (^Z, a debugger, a hung disk): the socket stays open
        out, err = proc.communicate(timeout=60)  # it waited for ever before
    finally:
        recv.proc.send_signal(signal.SIGCONT)
    assert proc.returncode == ExitCode.RESUMABLE, err  # 8: part of it is there, a re-run resumes
    assert b"confirmed nothing for 2 s" in err or b"without progress" in err, err
    last = json.loads(out.splitlines()[-1])  # no summary line at all before
    assert last["event"] == "summary" and last["complete"] is False and last["resumable"] is True, last
    assert 0 < last["chunks_acked"] < 300 and last["error"], last
    again = send([src], recv, "--chunk-size", "1M")
    assert again.returncode == 0, again.stderr
    assert summary(again)["bytes_raw"] < 300 << 20  # resumed, not started over
    assert (tmp_path / "dest" / "big.bin").read_bytes() == src.read_bytes()


class SlowLink(Relay):
    """Carries the sender's bytes to the receiver at `rate` bytes/s (the receiver's ACKs go back at
    full speed): a healthy link slower than one ACK batch per --timeout."""

    def __init__(self, target_port: int, rate: int):
        self.rate = rate
        self.piece = max(1, rate // 20)
        super().__init__(target_port)

    def accepted(self, client: socket.socket) -> None:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)

    def carry(self, data: bytes, seen: int) -> bytes:
        time.sleep(len(data) / self.rate)
        return data


def test_a_slow_link_is_not_taken_for_a_stalled_receiver(tmp_path: Path, receivers: list[Recv]) -> None:
    """The receiver confirms in batches of 8 chunks; here each batch takes ~3 s on the wire, three
    times --timeout. Bytes draining to it are movement: the old ACK deadline dropped this link."""
    src = tmp_path / "model.bin"
    src.write_bytes(os.urandom(12 * 64 << 10))  # 12 chunks of 64 KiB: the first ACK after 8
    recv = Recv(tmp_path / "dest", tmp_path / "cert", "tcp").start()
    receivers.append(recv)
    link = SlowLink(recv.port, 192 << 10)
    try:
        res = subprocess.run(
            rq_cmd(
                "send",
                str(src),
                f"rq://127.0.0.1:{link.port}",
                "--transport",
                "tcp",
                "--json",
                "--chunk-size",
                "64K",
                "--compress",
                "none",
                "--streams",
                "1",
                "--timeout",
                "1",
                "--retry-for",
                "0",
            ),
            env=rq_env(),
            capture_output=True,
            timeout=90,
            cwd=REPO,
            check=False,
        )
    finally:
        link.close()
    assert res.returncode == 0, res.stderr
    done = summary(res)
    assert done["complete"] and done["attempts"] == 1 and done["chunks_resent"] == 0, done
    assert (tmp_path / "dest" / "model.bin").read_bytes() == src.read_bytes()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_mid_send_still_ends_the_json_with_a_summary(
    tmp_path: Path, receivers: list[Recv], sig: signal.Signals
) -> None:
    """SIGTERM (a CI cancel, a pod stop) killed the sender outright: exit 143, no summary."""
    src = _big_file(tmp_path)
    recv = Recv(tmp_path / "dest", tmp_path / "cert").start()
    receivers.append(recv)
    assert recv.proc is not None
    rc, out, err = interrupt_mid_send(recv, src, "--json", "--chunk-size", "1M", sig=sig)
    assert rc == ExitCode.INTERRUPTED, err
    why = "interrupted" if sig == signal.SIGINT else "stopped by SIGTERM"
    # (Click added an empty line before); the line goes on with what the receiver holds (dt)
    (line,) = err.decode().splitlines()
    # (what the receiver confirmed so far, or that no confirmation had come back yet)
    assert line.startswith(f"rq: {why}; ") and "re-run the same command" in line, err
    last = json.loads(out.splitlines()[-1])
    assert last["event"] == "summary" and last["complete"] is False and last["chunks_sent"] > 0, last
    assert last["error"] == why, last  # "KeyboardInterrupt" before


def test_tls_on_one_side_only_is_a_usage_error_that_says_so(tmp_path: Path, receivers: list[Recv]) -> None:
    (tmp_path / "f").write_bytes(b"x" * 1000)
    with_tls = Recv(tmp_path / "d1", tmp_path / "cert", "tcp", "--tls").start()
    receivers.append(with_tls)
    plain = Recv(tmp_path / "d2", tmp_path / "cert").start()
    receivers.append(plain)
    res = subprocess.run(
        rq_cmd("send", str(tmp_path / "f"), with_tls.url, "--transport", "tcp"),
        env=rq_env(),
        capture_output=True,
        timeout=60,
        cwd=REPO,
        check=False,
    )
    assert res.returncode == ExitCode.USAGE, res.stderr  # was 6 after a minute of retries
    assert b"requires TLS: add --tls" in res.stderr and len(res.stderr.splitlines()) == 1, res.stderr
    assert with_tls.pin is not None
    res = subprocess.run(
        rq_cmd("send", str(tmp_path / "f"), plain.url, "--transport", "tcp", "--tls", "--pin", with_tls.pin),
        env=rq_env(),
        capture_output=True,
        timeout=60,
        cwd=REPO,
        check=False,
    )
    assert res.returncode == ExitCode.USAGE, res.stderr
    assert b"does not use TLS: drop --tls" in res.stderr, res.stderr
    assert send([tmp_path / "f"], with_tls).returncode == 0  # both sides agreeing still works
