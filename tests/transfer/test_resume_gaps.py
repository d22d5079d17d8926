"""Resume gaps a review left in `rq send` / `rq recv` (issue 4), each test failing before its fix:
a re-run with another --chunk-size, a received file deleted or changed on the receiver, and empty
directories. Real `rq recv` and `rq send` over TCP on loopback, plus the protocol core for the
hostile cases."""

from __future__ import annotations

import json
import os
from pathlib import Path

import orjson
import pytest
from xfer_kit import Recv, interrupt_after, journal_records, make_tree, summary, tree_digest, wait_for
from xfer_kit import send as rq_send

from transfer.errors import ProtocolError, UnsafeNameError
from transfer.frames import FrameDecoder, FrameType
from transfer.manifest import Limits, parse_manifest, transfer_id
from transfer.session import ReceiverChannel, control_raw
from transfer.store import Store

pytestmark = pytest.mark.integration


def _events(text: str) -> list[dict[str, object]]:
    return [json.loads(x) for x in text.splitlines() if x.strip()]


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
        interrupt_after(src, recv, 6, 256 << 10)
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


# -- 2. a received file deleted or changed on the receiver ----------------------------------------


def test_a_rerun_after_a_received_file_was_deleted_sends_only_that_file(tmp_path: Path) -> None:
    """Was: exit 9 ('this transfer completed here before …'). Now, like rsync, the re-run sends the
    missing file only: the files still in place are known by their stat, not read or hashed."""
    ckpt = make_tree(tmp_path / "src", 1_500_000, 400_000)
    dest = tmp_path / "dst"
    recv = Recv(dest, tmp_path / "cert", "tcp").start()
    try:
        assert rq_send([ckpt], recv, "--chunk-size", "256KiB").returncode == 0
        gone = dest / "ckpt" / "shards" / "rand.bin"
        kept = dest / "ckpt" / "shards" / "weights.bf16"
        ino = kept.stat().st_ino
        gone.unlink()
        proc = rq_send([ckpt], recv, "--chunk-size", "256KiB")
        assert proc.returncode == 0, proc.stderr.decode()
        s = summary(proc)
        assert s["bytes_raw"] == 1_500_000, s  # only the deleted file moved
        assert kept.stat().st_ino == ino  # the one in place was left alone, not rewritten
        assert tree_digest(dest / "ckpt") == tree_digest(ckpt)
        again = rq_send([ckpt], recv, "--chunk-size", "256KiB")  # everything in place: nothing moves
        assert again.returncode == 0 and summary(again)["bytes_raw"] == 0, again.stderr.decode()
    finally:
        recv.stop()


def test_a_received_file_changed_on_purpose_is_not_replaced_without_overwrite(tmp_path: Path) -> None:
    """A file the user edited after it landed is refused (exit 9, saying so), never overwritten;
    with `rq recv --overwrite` that file alone is sent again."""
    ckpt = make_tree(tmp_path / "src", 600_000, 100_000)
    dest = tmp_path / "dst"
    recv = Recv(dest, tmp_path / "cert", "tcp").start()
    edited = dest / "ckpt" / "index.json"
    try:
        assert rq_send([ckpt], recv).returncode == 0
        (dest / "ckpt" / "shards" / "rand.bin").unlink()
        with open(edited, "a") as fh:
            fh.write("\n// my note")
        proc = rq_send([ckpt], recv)
    finally:
        recv.stop()
    err = proc.stderr.decode()
    assert proc.returncode == 9, err
    assert "index.json was changed in the destination" in err and "--overwrite" in err, err
    assert edited.read_text().endswith("// my note")
    assert not (dest / "ckpt" / "shards" / "rand.bin").exists()
    again = Recv(dest, tmp_path / "cert", "tcp", "--overwrite", "--once").start()
    try:
        proc = rq_send([ckpt], again)
        assert proc.returncode == 0, proc.stderr.decode()
        assert again.wait()[0] == 0
    finally:
        again.stop()
    assert summary(proc)["bytes_raw"] == 600_000 + (ckpt / "index.json").stat().st_size
    assert tree_digest(dest / "ckpt") == tree_digest(ckpt)


# -- 3. empty directories --------------------------------------------------------------------------


def test_empty_directories_arrive_and_come_back_when_removed(tmp_path: Path) -> None:
    """Was: empty directories of a sent tree were skipped ('no file to send under it'). Now they
    are manifest entries (version 2) and are created on the receiver, like rsync -a; one removed on
    the receiver is made again by a re-run that moves no byte."""
    ckpt = make_tree(tmp_path / "src", 300_000, 10_000)
    (ckpt / "logs" / "tb").mkdir(parents=True)
    (ckpt / "optim").mkdir()
    dest = tmp_path / "dst"
    recv = Recv(dest, tmp_path / "cert", "tcp").start()
    try:
        proc = rq_send([ckpt], recv)
        assert proc.returncode == 0, proc.stderr.decode()
        s = summary(proc)
        assert s["dirs"] == 3 and s["skipped"] == 0, s  # logs, logs/tb, optim
        for d in ("logs/tb", "optim"):
            assert (dest / "ckpt" / d).is_dir() and not any((dest / "ckpt" / d).iterdir())
        assert tree_digest(dest / "ckpt") == tree_digest(ckpt)
        (dest / "ckpt" / "optim").rmdir()
        again = rq_send([ckpt], recv)
        assert again.returncode == 0, again.stderr.decode()
        assert summary(again)["bytes_raw"] == 0
        assert (dest / "ckpt" / "optim").is_dir()
    finally:
        recv.stop()
    only = tmp_path / "src" / "just-a-dir"
    only.mkdir()
    recv = Recv(dest, tmp_path / "cert", "tcp", "--once").start()
    try:
        proc = rq_send([only], recv)
        assert proc.returncode == 0, proc.stderr.decode()
        assert recv.wait()[0] == 0
    finally:
        recv.stop()
    assert (dest / "just-a-dir").is_dir()


def test_a_directory_entry_where_a_file_is_is_refused(tmp_path: Path) -> None:
    ckpt = tmp_path / "src" / "ckpt"
    (ckpt / "optim").mkdir(parents=True)
    (tmp_path / "dst" / "ckpt").mkdir(parents=True)
    (tmp_path / "dst" / "ckpt" / "optim").write_bytes(b"mine")
    recv = Recv(tmp_path / "dst", tmp_path / "cert", "tcp").start()
    try:
        proc = rq_send([ckpt], recv)
    finally:
        recv.stop()
    err = proc.stderr.decode()
    assert proc.returncode == 9, err
    assert "exists in the destination as a file where the transfer has a directory" in err
    assert (tmp_path / "dst" / "ckpt" / "optim").read_bytes() == b"mine"


def _manifest_body(dirs: list[str], version: int = 2) -> bytes:
    tid = transfer_id(1 << 20, (), tuple(dirs))
    return orjson.dumps(
        {"version": version, "transfer_id": tid, "chunk_size": 1 << 20, "files": [], "dirs": dirs}
    )


@pytest.mark.parametrize(
    "dirs", [["../escape"], ["/abs/dir"], ["a/../../b"], ["ok", "bad\x1bname"], [".rq-partial/x"], ["a/"]]
)
def test_a_hostile_directory_entry_is_refused_by_the_protocol_core(dirs: list[str]) -> None:
    """Directory names are data, never paths: the receiver's core refuses the manifest."""
    rc = ReceiverChannel(b"tok", os.urandom(16), Limits())
    rc.role, rc.transfer_id, rc.state = "control", transfer_id(1 << 20, (), tuple(sorted(dirs))), "manifest"
    body = _manifest_body(sorted(dirs))
    with pytest.raises(UnsafeNameError):
        for frame in FrameDecoder(1 << 20).feed(control_raw(FrameType.MANIFEST, body)):
            rc.handle(frame)


def test_directory_entries_follow_no_symlink_out_of_dest(tmp_path: Path) -> None:
    """A symlink planted under DEST cannot carry a directory entry outside it: refused when the
    transfer is planned, and at commit if it was planted after."""
    outside, dest = tmp_path / "outside", tmp_path / "dest"
    outside.mkdir()
    dest.mkdir()
    (dest / "link").symlink_to(outside)
    store = Store(dest)
    m = parse_manifest(_manifest_body(["link/sub"]), Limits())
    with pytest.raises(UnsafeNameError):
        store.plan(m)
    m2 = parse_manifest(_manifest_body(["later/sub"]), Limits())
    plan = store.plan(m2)
    (dest / "later").symlink_to(outside)
    with pytest.raises(UnsafeNameError):
        plan.finalize([], overwrite=False)
    plan.close()
    store.close()
    assert list(outside.iterdir()) == []


def test_an_unknown_manifest_version_is_refused_in_one_line() -> None:
    """A manifest version this rq does not know is one line naming both (an rq before directory
    entries says the same of version 2: "unsupported protocol version 2 (this rq speaks 1)")."""
    with pytest.raises(ProtocolError, match=r"unsupported protocol version 3 \(this rq speaks 1-2\)"):
        parse_manifest(_manifest_body(["a"], version=3), Limits())
    with pytest.raises(ProtocolError, match="version 1 manifest cannot list directories"):
        parse_manifest(_manifest_body(["a"], version=1), Limits())


def test_a_rerun_with_another_chunk_size_after_a_deletion_keeps_the_files_in_place(tmp_path: Path) -> None:
    """Both gaps at once: the transfer completed at 256 KiB chunks, one file was deleted on the
    receiver, and the re-run asks for 1 MiB: the files in place are kept (the sender adopts the
    size they were placed at) and only the deleted one moves."""
    ckpt = make_tree(tmp_path / "src", 1_200_000, 300_000)
    dest = tmp_path / "dst"
    recv = Recv(dest, tmp_path / "cert", "tcp").start()
    try:
        assert rq_send([ckpt], recv, "--chunk-size", "256KiB").returncode == 0
        (dest / "ckpt" / "shards" / "rand.bin").unlink()
        proc = rq_send([ckpt], recv, "--chunk-size", "1MiB")
    finally:
        recv.stop()
    assert proc.returncode == 0, proc.stderr.decode()
    s = summary(proc)
    assert s["bytes_raw"] == 1_200_000 and s["chunk_size"] == 256 << 10, s
    assert tree_digest(dest / "ckpt") == tree_digest(ckpt)
