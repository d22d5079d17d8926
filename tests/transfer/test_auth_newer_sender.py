"""A sender of a later release (HELLO with an auth version above this receiver's) is refused with a
line that says the receiver is the older side, not "that rq send is older: upgrade rq on the
sending side" (which sent its user to upgrade the newer rq); the CLI's hint names both versions."""

from __future__ import annotations

import json
from pathlib import Path

from xfer_kit import Recv, hello_reply

from rqcli.commands.transfer import _cli_error
from transfer.errors import AuthError
from transfer.session import AUTH_VERSION


def test_a_newer_sender_is_told_the_receiver_is_older(tmp_path: Path) -> None:
    recv = Recv(tmp_path / "dst", tmp_path / "cert", "tcp").start()
    try:
        answer = hello_reply(recv.port, auth=AUTH_VERSION + 1)
        assert answer["type"] == "ERROR", answer
        message = str(answer["message"])
        assert f"auth {AUTH_VERSION + 1}, newer" in message, message
        assert "upgrade rq on the receiving side" in message  # (old: "...on the sending side")
    finally:
        _, out, _ = recv.stop()
    refused = [json.loads(x) for x in out.splitlines() if '"refused"' in x]
    assert refused and "upgrade rq on the receiving side" in refused[0]["error"]


def test_the_cli_hint_names_the_newer_auth() -> None:
    err = AuthError(f"that rq send speaks protocol auth {AUTH_VERSION + 1}, newer than this rq recv's")
    hint = _cli_error(err).hint or ""
    assert hint.startswith(f"the other side speaks auth {AUTH_VERSION + 1}; this rq speaks"), hint
