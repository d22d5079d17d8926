"""SIGTERM stops `rq recv` at once, transfers in flight included (their senders resume on a re-run):
it says which transfers it cut off. Before, it exited 0 without a word about them."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from xfer_kit import Recv, control_channel
from xfer_kit import send as rq_send

from transfer.frames import FrameType, header
from transfer.manifest import FileEntry, file_key, make_manifest

pytestmark = pytest.mark.integration


def test_sigterm_mid_transfer_names_the_transfer_it_cut(tmp_path: Path) -> None:
    chunk = 1 << 16
    files = (
        FileEntry(name="w.bin", size=3 * chunk, mode=0o644, key=file_key("w.bin", 3 * chunk, 1, 7, chunk)),
    )
    m = make_manifest(chunk, list(files))
    recv = Recv(tmp_path / "dst", tmp_path / "cert", "tcp").start()
    assert recv.proc is not None and recv.proc.stdout is not None
    ch = control_channel(recv.port, m.transfer_id)  # a sender that planned and sent nothing yet
    try:
        body = m.to_json()
        ch.send(header(FrameType.MANIFEST, len(body)), body)
        frame = ch.recv(10)
        assert frame is not None and frame.type is FrameType.ACCEPT
        planned = json.loads(recv.proc.stdout.readline())  # the receiver's `transfer` line
        assert planned["event"] == "transfer" and planned["transfer_id"] == m.transfer_id
        recv.proc.send_signal(signal.SIGTERM)
        rc, out, err = recv.wait(60)
    finally:
        ch.close()
        recv.kill()
    assert rc == 0, err  # SIGTERM is how a receiver without --once is stopped
    lines = [json.loads(x) for x in out.splitlines()]
    assert lines[-1] == {
        "event": "interrupted",
        "transfer_id": m.transfer_id,
        "files": 1,
        "bytes": 3 * chunk,
    }, lines
    assert f"stopped transfer {m.transfer_id[:12]} mid-way" in err and "re-run" in err, err


def test_a_stop_after_the_transfer_completed_reports_nothing_cut(tmp_path: Path) -> None:
    src = tmp_path / "f.bin"
    src.write_bytes(b"y" * 100_000)
    recv = Recv(tmp_path / "dst", tmp_path / "cert", "tcp").start()
    try:
        res = rq_send([src], recv)
        assert res.returncode == 0, res.stderr
    finally:
        rc, out, err = recv.stop()
    assert rc == 0 and "mid-way" not in err, err
    assert [json.loads(x)["event"] for x in out.splitlines()][-1] == "done", out


def test_a_cut_transfer_finished_since_is_not_reported(tmp_path: Path) -> None:
    """A --workers receiver collects its workers' `interrupted` lines as they come and reports them
    when it stops: one from a worker someone else stopped hours ago named a transfer that the
    sender's re-run had completed since ("stopped mid-way … re-run resumes it" for a finished one)."""
    from rqcli.commands.transfer import _still_cut
    from transfer.store import Store

    src = tmp_path / "f.bin"
    src.write_bytes(b"z" * 50_000)
    recv = Recv(tmp_path / "dst", tmp_path / "cert", "tcp", "--once").start()
    try:
        res = rq_send([src], recv)
        assert res.returncode == 0, res.stderr
    finally:
        recv.stop()
    done = [json.loads(x) for x in res.stdout.decode().splitlines() if '"summary"' in x][-1]
    finished, other = {"event": "interrupted", "transfer_id": done["transfer_id"]}, {"transfer_id": "f" * 32}
    store = Store(tmp_path / "dst")
    try:
        assert _still_cut([finished, other], store) == [other]
    finally:
        store.close()
