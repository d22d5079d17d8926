"""A receiver serving transfer after transfer (rq recv running for weeks, or a library user's
Receiver) kept one summary dict per finished transfer in Receiver.summaries, which nothing read:
~7 KiB each, for good. What a Receiver holds must not grow with the transfers it finished."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sized
from pathlib import Path

from transfer.receiver import Receiver
from transfer.sender import SendOptions, send
from transfer.tcp import TcpTransport
from transfer.transport import ConnectOptions, Identity, ListenOptions

TOKEN = b"leakfix-token-" + b"x" * 18


def _sizes(receiver: Receiver) -> dict[str, int]:
    return {k: len(v) for k, v in vars(receiver).items() if isinstance(v, Sized) and not isinstance(v, str)}


def test_finished_transfers_leave_nothing_behind_in_the_receiver(tmp_path: Path) -> None:
    receiver = Receiver(tmp_path / "dst", TOKEN)
    listener = TcpTransport().listen(
        ListenOptions("127.0.0.1", 0, Identity(b"", b"", ""), tls=False), receiver.handle_channel
    )
    threading.Thread(target=listener.serve_forever, daemon=True).start()
    copts = ConnectOptions("127.0.0.1", listener.address[1], None, tls=False)
    opts = SendOptions(streams=1, chunk_size=64 * 1024, compress="none")
    try:
        sizes = []
        for i in range(4):
            src = tmp_path / f"src{i}"
            src.mkdir()
            (src / "f").write_bytes(os.urandom(1000 + i))
            assert send([src], TcpTransport(), copts, TOKEN, opts)["verified"]
            if i % 2:  # and one that was already complete
                assert send([src], TcpTransport(), copts, TOKEN, opts)["verified"]
            # a finished transfer's plan goes as its channels end (their threads, after send
            # returned): wait for that, up to 30 s, or a slow runner measures a plan still open
            deadline = time.monotonic() + 30
            while receiver._plans and time.monotonic() < deadline:
                time.sleep(0.02)
            assert not receiver._plans, f"transfer {i}: its plan still open after 30 s"
            sizes.append(_sizes(receiver))
    finally:
        listener.close()
        receiver.close()
    assert sizes[-1] == sizes[0], f"{sizes[0]} -> {sizes[-1]}"  # old code: summaries 1 -> 6
