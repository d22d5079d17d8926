"""A sender of a later release (HELLO with an auth version above this receiver's) is refused with a
line that says the receiver is the older side, not "that rq send is older: upgrade rq on the
sending side" (which sent its user to upgrade the newer rq); the CLI's hint names both versions."""

from __future__ import annotations

import base64
import json
import os
import socket
from pathlib import Path

from xfer_kit import Recv

from rqcli.commands.transfer import _cli_error
from transfer.errors import AuthError
from transfer.frames import FrameType, control
from transfer.session import AUTH_VERSION
from transfer.tcp import TcpChannel


def test_a_newer_sender_is_told_the_receiver_is_older(tmp_path: Path) -> None:
    recv = Recv(tmp_path / "dst", tmp_path / "cert", "tcp").start()
    try:
        ch = TcpChannel(socket.create_connection(("127.0.0.1", recv.port), timeout=10), 1 << 20)
        hello = {
            "role": "control",
            "transfer_id": "t" * 32,
            "nonce": base64.b64encode(os.urandom(16)).decode(),
            "auth": AUTH_VERSION + 1,
        }
        ch.send(control(FrameType.HELLO, hello))
        frame = ch.recv(10)
        assert frame is not None and frame.type is FrameType.ERROR, frame
        message = frame.json()["message"]
        assert f"auth {AUTH_VERSION + 1}, newer" in message, message
        assert "upgrade rq on the receiving side" in message  # (old: "...on the sending side")
        ch.close()
    finally:
        _, out, _ = recv.stop()
    refused = [json.loads(x) for x in out.splitlines() if '"refused"' in x]
    assert refused and "upgrade rq on the receiving side" in refused[0]["error"]


def test_the_cli_hint_names_the_newer_auth() -> None:
    err = AuthError(f"that rq send speaks protocol auth {AUTH_VERSION + 1}, newer than this rq recv's")
    hint = _cli_error(err).hint or ""
    assert hint.startswith(f"the other side speaks auth {AUTH_VERSION + 1}; this rq speaks"), hint
