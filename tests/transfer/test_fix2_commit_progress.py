"""After COMMIT the sender waited max(--timeout, 120) s per try for DONE, so a receiver that stalled
while placing files took minutes per retry to notice. A receiver now sends PROGRESS every
receiver.PROGRESS_S while it works on a COMMIT, to a sender that asked for it in HELLO (features),
and says so in ACCEPT; such a sender waits only sender.PROGRESS_SILENCE of those intervals of
silence. Older peers on either side keep the long wait (nothing new is sent to or expected of them)."""

from __future__ import annotations

import base64
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from transfer import receiver as receiver_mod
from transfer import sender as sender_mod
from transfer.errors import TransferError
from transfer.frames import Frame, FrameDecoder, FrameType, control
from transfer.manifest import Limits, make_manifest
from transfer.receiver import Receiver
from transfer.sender import SendOptions, send
from transfer.session import Accepted, ReceiverChannel, SenderChannel
from transfer.source import scan
from transfer.store import Store
from transfer.tcp import TcpTransport
from transfer.transport import ConnectOptions, Identity, ListenOptions

TOKEN = b"fix2-progress-" + b"y" * 18
CS = 64 * 1024
OPTS = SendOptions(streams=1, chunk_size=CS, compress="none", retry_for=0.5, first_connect_for=5.0)


@contextmanager
def _receiver(dest: Path) -> Iterator[int]:
    receiver = Receiver(dest, TOKEN)
    listener = TcpTransport().listen(
        ListenOptions("127.0.0.1", 0, Identity(b"", b"", ""), tls=False), receiver.handle_channel
    )
    threading.Thread(target=listener.serve_forever, daemon=True).start()
    try:
        yield listener.address[1]
    finally:
        listener.close()
        receiver.close()


def _send(
    src: Path, port: int, opts: SendOptions = OPTS, wait: float = 60, timeout: float = 10.0
) -> dict[str, Any]:
    """send() in a thread, bounded by `wait` s: what it returned or raised, and how long it took.
    `timeout`: the connection's (ConnectOptions.timeout, the wait for a reconnect's answer)."""
    out: dict[str, Any] = {}

    def run() -> None:
        started = time.monotonic()
        try:
            out["summary"] = send(
                [src],
                TcpTransport(),
                ConnectOptions("127.0.0.1", port, None, tls=False, timeout=timeout),
                TOKEN,
                opts,
            )
        except TransferError as exc:
            out["error"] = exc
        out["seconds"] = time.monotonic() - started

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(wait)
    return out


def _slow_placing(monkeypatch: pytest.MonkeyPatch, gate: threading.Event, seconds: float) -> None:
    place_all = Store.place_all

    def slow(self: Store, *args: Any, **kwargs: Any) -> None:
        gate.wait(seconds)
        place_all(self, *args, **kwargs)

    monkeypatch.setattr(Store, "place_all", slow)


def _src(tmp_path: Path) -> Path:
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(3 * CS))
    return src


def test_a_receiver_that_stalls_after_commit_is_given_up_on_in_a_few_progress_intervals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A receiver that announced PROGRESS and then sends none (a stopped process, a hung disk under
    the whole receiver) is dropped after 3 intervals of silence, not after the 120 s COMMIT wait."""
    monkeypatch.setattr(receiver_mod, "PROGRESS_S", 0.2, raising=False)
    if hasattr(receiver_mod, "_Progress"):  # (so that the test runs against an rq without it too)
        monkeypatch.setattr(receiver_mod._Progress, "_run", lambda self: None)  # announced, then hung
    gate = threading.Event()
    _slow_placing(monkeypatch, gate, 30.0)
    src = _src(tmp_path)
    try:
        with _receiver(tmp_path / "dst") as port:
            # bounded below the placement's own 30 s: a sender that waits for DONE is still
            # waiting then (the old code: 120 s), one that gave up is done long before. Its
            # reconnect to the receiver still busy placing goes unanswered: 2 s for that answer,
            # not the default 10 s (it gave up on the COMMIT after 0.6 s of silence either way)
            got = _send(src, port, wait=25, timeout=2.0)
            gate.set()  # the receiver's close need not wait for the held placement
    finally:
        gate.set()
    assert "seconds" in got, "the sender still waits for DONE (the old 120 s COMMIT wait)"
    assert "error" in got and got["seconds"] < 25, got


def test_a_long_placement_that_reports_progress_is_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Silence is what counts: placing for 2 s, longer than the sender's 1.5 s silence window,
    goes on to DONE because PROGRESS keeps coming (every 0.05 s: the window is 30 intervals, so a
    PROGRESS frame up to ~1.4 s late on a loaded runner still counts)."""
    monkeypatch.setattr(receiver_mod, "PROGRESS_S", 0.05, raising=False)
    monkeypatch.setattr(sender_mod, "PROGRESS_SILENCE", 30.0, raising=False)
    _slow_placing(monkeypatch, threading.Event(), 2.0)
    src = _src(tmp_path)
    with _receiver(tmp_path / "dst") as port:
        got = _send(src, port)
    assert "summary" in got and got["summary"]["verified"], got
    assert (tmp_path / "dst" / "src.bin").read_bytes() == src.read_bytes()


def test_an_older_receiver_sends_no_progress_and_keeps_the_long_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A receiver that announces nothing in ACCEPT (an older rq recv) sends no PROGRESS: the sender
    keeps max(--timeout, COMMIT_WAIT) for DONE (here lowered to 3 s; placing takes 1.2 s)."""
    monkeypatch.setattr(receiver_mod, "PROGRESS_S", None, raising=False)
    monkeypatch.setattr(sender_mod, "COMMIT_WAIT", 3.0)
    _slow_placing(monkeypatch, threading.Event(), 1.2)
    src = _src(tmp_path)
    with _receiver(tmp_path / "dst") as port:
        got = _send(src, port, SendOptions(streams=1, chunk_size=CS, compress="none", ack_timeout=0.5))
    assert "summary" in got and got["summary"]["verified"], got


def _frames(blob: bytes) -> list[Frame]:
    return FrameDecoder(1 << 20).feed(blob)


def test_progress_is_offered_only_to_a_sender_that_asked() -> None:
    """HELLO without "features" (an older rq send, which would refuse an unknown frame type 13):
    no "progress" in ACCEPT and no PROGRESS frame; with it, both."""
    for asks in (False, True):
        core = ReceiverChannel(TOKEN, os.urandom(16), Limits())
        hello: dict[str, Any] = {
            "role": "control",
            "transfer_id": "0" * 32,
            "nonce": base64.b64encode(os.urandom(16)).decode(),
            "auth": 2,
        }
        if asks:
            hello["features"] = ["progress", "something-newer"]
        core.handle(_frames(control(FrameType.HELLO, hello))[0])
        core.outbox.clear()
        core.accept(make_manifest(CS, []), [], progress_every=5.0)
        accept = _frames(core.outbox[-1])[0].json_object()
        assert ("progress" in accept) is asks
        core.state = "committing"
        assert bool(core.progress(1.0)) is asks


def test_the_sender_asks_on_its_control_channel_and_refuses_a_bad_interval(tmp_path: Path) -> None:
    src = _src(tmp_path)
    manifest, _ = scan([src], CS, [])
    core = SenderChannel(TOKEN, "control", manifest, os.urandom(16))
    core.start()
    hello = _frames(core.outbox[0])[0].json_object()
    assert hello["features"] == ["progress"]
    data = SenderChannel(TOKEN, "data", manifest, os.urandom(16))
    data.start()
    assert "features" not in _frames(data.outbox[0])[0].json_object()
    for bad in (0, -1, "5", True, 1e9):
        core.state = "accept"
        with pytest.raises(TransferError):
            core.handle(_accept({"have": {}, "progress": bad}))
    core.state = "accept"
    (ev,) = core.handle(_accept({"have": {}, "progress": 5}))
    assert isinstance(ev, Accepted) and ev.progress_every == 5.0


def _accept(body: dict[str, Any]) -> Frame:
    return _frames(control(FrameType.ACCEPT, body))[0]
