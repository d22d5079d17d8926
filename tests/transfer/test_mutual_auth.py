"""The receiver proves it holds the token before the sender sends its MAC, the manifest or any data
(protocol auth 2, docs/protocol.md); an older peer on either side is refused with a line naming the
side to upgrade. Also: a bad ACCEPT is a protocol error, and a receiver that never answers COMMIT
and acknowledges the same chunks again cannot hold a sender for ever."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest
from fake_receiver_kit import FakeReceiver
from xfer_kit import REPO, TOKEN, Recv, hello_reply, rq_cmd, rq_env, send, summary

from transfer import sender as sender_mod
from transfer.errors import PeerUnreachableError, ProtocolError
from transfer.frames import FrameDecoder, FrameType, control
from transfer.session import SenderChannel, control_raw
from transfer.tcp import TcpTransport
from transfer.transport import ConnectOptions


def _src(tmp_path: Path, size: int = 300_000) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(os.urandom(size))
    return src


def _send_to_fake(src: Path, fake: FakeReceiver, *extra: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        rq_cmd("send", str(src), f"rq://127.0.0.1:{fake.port}", "--transport", "tcp", "--json", *extra),
        env=rq_env(),
        capture_output=True,
        timeout=60,
        cwd=REPO,
        check=False,
    )


def _stderr_lines(proc: subprocess.CompletedProcess[bytes]) -> list[str]:
    return [line for line in proc.stderr.decode().splitlines() if line.startswith("rq:")]


@pytest.mark.parametrize(
    ("mode", "said"),
    [
        ("no-proof", "did not prove it holds the token"),
        ("bad-proof", "proof of the token is wrong"),
    ],
)
def test_a_receiver_without_the_token_is_sent_nothing(tmp_path: Path, mode: str, said: str) -> None:
    """The review's repro: plain TCP to a receiver that does not know the token was exit 0,
    `verified: true`, with every chunk in the impostor's hands."""
    src = _src(tmp_path)
    with FakeReceiver(mode) as fake:
        proc = _send_to_fake(src, fake, "--retry-for", "5")
        time.sleep(0.2)  # anything sent after the handshake would have arrived by now
        seen = fake.seen()
    assert proc.returncode == 4, proc.stderr.decode()
    (line,) = _stderr_lines(proc)
    assert said in line
    assert "nothing was sent" in line
    assert summary(proc)["verified"] is False
    # HELLO, and the ERROR that tells the fake's side why: no MAC, no manifest, no chunk
    assert seen <= {"HELLO", "ERROR"}, seen
    assert fake.count("HELLO") == 1  # an authentication failure is final, not retried


def test_no_proof_names_the_receiver_to_upgrade(tmp_path: Path) -> None:
    with FakeReceiver("no-proof") as fake:
        proc = _send_to_fake(_src(tmp_path, 1000), fake)
    assert proc.returncode == 4
    err = proc.stderr.decode()
    assert "upgrade rq on the receiving side" in err
    # the token and the pin are not at fault: the hint must not send the user to check them
    assert "RQ_TOKEN" not in err and "rq --version" in err


def test_an_older_sender_is_refused_with_a_line_naming_it(tmp_path: Path) -> None:
    """What an rq send from before auth 2 sends: HELLO without "auth". It gets ERROR auth, whose
    message that sender prints as its one line (exit 4 there), and never a CHALLENGE."""
    recv = Recv(tmp_path / "dst", tmp_path / "cert", "tcp").start()
    try:
        answer = hello_reply(recv.port)  # no "auth" at all
        assert answer["type"] == "ERROR" and answer["code"] == "auth", answer
        assert "upgrade rq on the sending side" in str(answer["message"])
    finally:
        _, out, _ = recv.stop()
    refused = [json.loads(x) for x in out.splitlines() if '"refused"' in x]
    assert refused and "upgrade rq on the sending side" in refused[0]["error"]


@pytest.mark.parametrize("transport", ["tcp", "quic"])
def test_a_receiver_with_another_token_gets_no_manifest(tmp_path: Path, transport: str) -> None:
    """A real rq recv holding another token: the sender refuses its proof (on QUIC too, where the
    pin authenticates the certificate but not the token), so the receiver never sees a manifest."""
    recv = Recv(tmp_path / "dst", tmp_path / "cert", transport, env=rq_env("another-token")).start()
    try:
        proc = send([_src(tmp_path)], recv, "--retry-for", "5")
    finally:
        _, out, _ = recv.stop()
    assert proc.returncode == 4, proc.stderr.decode()
    assert "proof of the token is wrong" in proc.stderr.decode()
    events = [json.loads(x).get("event") for x in out.splitlines() if x.strip()]
    assert "transfer" not in events  # no manifest reached it
    assert not list((tmp_path / "dst").glob("src*"))


@pytest.mark.parametrize("transport", ["tcp", "quic"])
def test_the_real_pair_still_authenticates_and_sends(tmp_path: Path, transport: str) -> None:
    src = _src(tmp_path)
    recv = Recv(tmp_path / "dst", tmp_path / "cert", transport, "--once").start()
    try:
        proc = send([src], recv)
    finally:
        recv.wait(30)
    assert proc.returncode == 0, proc.stderr.decode()
    assert summary(proc)["verified"] is True
    assert (tmp_path / "dst" / "src" / "a.bin").read_bytes() == (src / "a.bin").read_bytes()


# -- the sender's half on its own ----------------------------------------------------------------


def test_sender_core_sends_nothing_after_hello_without_a_valid_proof() -> None:
    from transfer.errors import AuthError
    from transfer.manifest import FileEntry, make_manifest

    m = make_manifest(1 << 16, [FileEntry("a", 10, 0o644, "k" * 32)])
    for challenge in ({}, {"proof": "00" * 32}, {"proof": 7}, {"proof": "\u00e9"}):
        snd = SenderChannel(TOKEN.encode(), "control", m, os.urandom(16))
        snd.start()
        snd.outbox.clear()
        body = {"nonce": base64.b64encode(os.urandom(16)).decode(), **challenge}
        (frame,) = FrameDecoder(1 << 20).feed(control(FrameType.CHALLENGE, body))
        with pytest.raises(AuthError):
            snd.handle(frame)
        sent = [f.type for raw in snd.outbox for f in FrameDecoder(1 << 20).feed(raw)]
        assert sent == [FrameType.ERROR], challenge


# -- a bad ACCEPT ---------------------------------------------------------------------------------


def test_an_accept_with_a_non_integer_file_index_is_a_protocol_error(tmp_path: Path) -> None:
    """Was 'unexpected ValueError', exit 1 with a Python error for a line."""
    with FakeReceiver("bad-accept", TOKEN.encode()) as fake:
        proc = _send_to_fake(_src(tmp_path, 1000), fake)
    assert proc.returncode == 1, proc.stderr.decode()
    (line,) = _stderr_lines(proc)
    assert "bad ACCEPT body" in line and "ValueError" not in line


@pytest.mark.parametrize(
    "have",
    [{"abc": "!!"}, {"0": "!!"}, {"0": 5}, {"-1": ""}, {"٣": ""}, ["0"], "x", {"0": "QUJD"}],
    ids=["name", "not-base64", "int-blob", "negative", "arabic-digit", "list", "string", "not-20-bytes"],
)
def test_bad_have_values_are_protocol_errors(have: object) -> None:
    from transfer.manifest import FileEntry, make_manifest

    m = make_manifest(1 << 16, [FileEntry("a", 10, 0o644, "k" * 32)])
    snd = SenderChannel(TOKEN.encode(), "control", m, os.urandom(16))
    snd.state = "accept"
    (frame,) = FrameDecoder(1 << 20).feed(control_raw(FrameType.ACCEPT, json.dumps({"have": have}).encode()))
    with pytest.raises(ProtocolError):
        snd.handle(frame)


# -- a receiver that never answers COMMIT ----------------------------------------------------------


def test_a_receiver_stalling_after_commit_does_not_hold_the_sender_for_ever(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The review's case: each attempt re-sent every chunk, the fake ACKed them again (counted as
    progress), COMMIT went unanswered, and the sender reconnected for ever. Chunks acknowledged
    again are no progress now: the send gives up after --retry-for, having committed twice."""
    monkeypatch.setattr(sender_mod, "COMMIT_WAIT", 0.5)  # instead of waiting 120 s per COMMIT
    src = _src(tmp_path, 200_000)
    with FakeReceiver("stall-commit", TOKEN.encode()) as fake:
        copts = ConnectOptions("127.0.0.1", fake.port, None, tls=False, timeout=5)
        opts = sender_mod.SendOptions(chunk_size=1 << 16, retry_for=1.0, ack_timeout=0.5, streams=1)
        result: list[BaseException | dict[str, object]] = []

        def run() -> None:
            try:
                result.append(sender_mod.send([src], TcpTransport(), copts, TOKEN.encode(), opts))
            except BaseException as exc:
                result.append(exc)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        t.join(60)  # generous: a bounded send ends in a few seconds; the old one never did
        commits = fake.count("COMMIT")
    assert not t.is_alive(), f"still retrying after 60 s ({commits} COMMITs unanswered)"
    (outcome,) = result
    assert isinstance(outcome, PeerUnreachableError), outcome
    assert "without progress" in str(outcome)
    assert 1 <= commits <= 4, commits


def test_a_receiver_that_keeps_what_it_acknowledged_still_counts_as_progress() -> None:
    stats = sender_mod.Stats()
    stats.had_chunks, stats.acked = 0, 5
    assert sender_mod._moved_on(stats, 0)  # first attempt: 5 new durable chunks
    stats.had_chunks, stats.acked = 0, 10
    assert not sender_mod._moved_on(stats, 5)  # the same 5 again, after the receiver forgot them
    stats.had_chunks, stats.acked = 5, 13
    assert sender_mod._moved_on(stats, 10)  # resumed at 5 and 3 more: 8 durable now
