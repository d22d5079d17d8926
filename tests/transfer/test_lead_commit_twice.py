"""A sender that sent COMMIT twice (or a CHUNK after COMMIT) got DONE and then an ERROR, and the
receiver printed `transfer … complete and verified` followed by `rq: warning: refused a
transfer: unexpected COMMIT after COMMIT` (fz): the transfer had not been refused. The ERROR
still goes to the sender; the receiver reports the transfer once, as finished."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from xfer_kit import TOKEN, Recv

from transfer import session
from transfer.sender import SendOptions, send
from transfer.transport import ConnectOptions, get_transport


def test_a_second_commit_is_not_reported_as_a_refused_transfer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = session.SenderChannel.commit

    def commit_twice(self: session.SenderChannel, roots: list[str]) -> None:
        real(self, roots)
        real(self, roots)

    monkeypatch.setattr(session.SenderChannel, "commit", commit_twice)
    src = tmp_path / "a.bin"
    src.write_bytes(os.urandom(100_000))
    recv = Recv(tmp_path / "dst", tmp_path / "cert", "tcp", "--once").start()
    try:
        copts = ConnectOptions("127.0.0.1", recv.port, None, tls=False)
        send(
            [src], get_transport("tcp"), copts, TOKEN.encode(), SendOptions(compress="none"), lambda ev: None
        )
        rc, out, err = recv.wait()
    finally:
        recv.stop()
    assert rc == 0, err
    assert (tmp_path / "dst" / "a.bin").read_bytes() == src.read_bytes()
    events = [line for line in out.splitlines() if line.strip()]
    assert any('"done"' in line for line in events), out
    assert not any('"refused"' in line for line in events), out  # after "done", before
    assert "refused a transfer" not in err, err
