"""Resume gaps a review left in `rq send` / `rq recv` (issue 4), each test failing before its fix:
a re-run with another --chunk-size, a received file deleted or changed on the receiver, and empty
directories. Real `rq recv` and `rq send` over TCP on loopback, plus the protocol core for the
hostile cases."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from xfer_kit import TOKEN, Recv, journal_records, summary, wait_for
from xfer_kit import send as rq_send

from transfer.events import ChunkMoved, Event
from transfer.sender import SendOptions, send
from transfer.transport import ConnectOptions, get_transport

pytestmark = pytest.mark.integration


def _events(text: str) -> list[dict[str, object]]:
    return [json.loads(x) for x in text.splitlines() if x.strip()]


def _interrupt_after(src: Path, recv: Recv, chunks: int, chunk_size: int) -> None:
    """Sends `src` with the library until `chunks` chunks went out, then dies like a killed sender."""

    class Stop(BaseException):
        pass

    moved = [0]

    def on_event(ev: Event) -> None:
        if isinstance(ev, ChunkMoved):
            moved[0] += 1
            if moved[0] > chunks:
                raise Stop

    copts = ConnectOptions("127.0.0.1", recv.port, None, tls=False)
    opts = SendOptions(chunk_size=chunk_size, window=1, streams=1, compress="none")
    with pytest.raises(Stop):
        send([src], get_transport("tcp"), copts, TOKEN.encode(), opts, on_event)


# -- 1. another --chunk-size on the re-run ------------------------------------------------------------


def test_a_rerun_with_another_chunk_size_keeps_what_arrived(tmp_path: Path) -> None:
    """Was: the re-run with another --chunk-size got new file keys, so the receiver dropped every
    verified chunk and said 'source changed'. Now the sender adopts the chunk size the receiver's
    journal was written with, says so, and moves only the rest."""
    src = tmp_path / "model.bin"
    size = 6 << 20
    src.write_bytes(os.urandom(size))
    dest = tmp_path / "dst"
    recv = Recv(dest, tmp_path / "cert", "tcp").start()
    try:
        _interrupt_after(src, recv, 6, 256 << 10)
        assert wait_for(lambda: journal_records(dest) >= 4, 10)
        have = journal_records(dest) * (256 << 10)
        proc = rq_send([src], recv, "--chunk-size", "1MiB", "--compress", "none")
        assert proc.returncode == 0, proc.stderr.decode()
    finally:
        _rc, out, _err = recv.stop()
    s = summary(proc)
    assert s["bytes_raw"] <= size - have, s  # nothing that arrived moved again
    ev = [e for e in _events(proc.stdout.decode()) if e.get("event") == "chunk_size"]
    assert ev and ev[0]["chunk_size"] == 256 << 10 and ev[0]["asked"] == 1 << 20, proc.stdout.decode()
    err = proc.stderr.decode()
    assert "256 KiB" in err and "source changed" not in err, err
    assert not any(e.get("restarted") for e in _events(out)), out
    assert (dest / "model.bin").read_bytes() == src.read_bytes()
