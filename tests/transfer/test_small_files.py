"""Many small files (a sharded checkpoint): the receiver makes them durable in batches, not file by
file, and a receiver killed in the middle of such a batch loses nothing it acknowledged.

The sync counts below are behaviour, not timing: the old receiver made ~7 fsync/fdatasync calls per
file (journal creation, per-batch fdatasync and journal fsync per file, part fsync, directory fsync,
and the placed record's fsync + directory fsync); the batched one makes a few per batch."""

from __future__ import annotations

import errno
import os
import subprocess
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from xfer_kit import Recv, rq_cmd, rq_env, send, summary, tree_digest, wait_for

from transfer import codec
from transfer import store as store_mod
from transfer.frames import ChunkHeader, Frame, FrameDecoder, FrameType, chunk_frame_header, parse_pairs
from transfer.manifest import FileEntry, Manifest, file_key, make_manifest
from transfer.receiver import Receiver
from transfer.session import CONTROL, Accepted, Done, SenderChannel
from transfer.store import Store

TOKEN = b"small-files-token"
CS = 1 << 20


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Counts the receiver's flushes: os.fsync, os.fdatasync and syncfs(2) as the store calls it."""
    seen: Counter[str] = Counter()
    real_fsync, real_fdatasync = os.fsync, os.fdatasync
    real_syncfs = getattr(store_mod, "_syncfs", None)  # (absent before batching: run on old code)

    def fsync(fd: Any) -> None:
        seen["fsync"] += 1
        real_fsync(fd)

    def fdatasync(fd: Any) -> None:
        seen["fdatasync"] += 1
        real_fdatasync(fd)

    def syncfs(fd: int) -> bool:
        assert real_syncfs is not None
        done = real_syncfs(fd)
        seen["syncfs"] += done
        return done

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "fdatasync", fdatasync)
    if real_syncfs is not None:
        monkeypatch.setattr(store_mod, "_syncfs", syncfs)
    yield seen


def _small_manifest(n: int, size: int = 2000) -> tuple[Manifest, list[bytes]]:
    datas = [os.urandom(size) for _ in range(n)]
    entries = [
        FileEntry(
            name=f"ckpt/rank{i % 4}/shard{i:04d}.bin",
            size=size,
            mode=0o644,
            key=file_key(f"s{i}", size, 1, i, CS),
        )
        for i in range(n)
    ]
    m = make_manifest(CS, entries)
    by_name = {e.name: d for e, d in zip(entries, datas, strict=True)}
    return m, [by_name[f.name] for f in m.files]


class _ScriptedSender:
    """A channel for Receiver.handle_channel driven by the real sender core in this thread: it
    answers the receiver's frames as a sender would and, once accepted, has every chunk and the
    COMMIT waiting at once (`readable()` says so), like a sender whose window is never full. A
    stand-in for a socket only: the protocol, the store and the disk are the real ones."""

    def __init__(self, m: Manifest, datas: list[bytes]):
        self.core = SenderChannel(TOKEN, CONTROL, m, os.urandom(16))
        self.core.start()
        self.m, self.datas = m, datas
        self.inbox = FrameDecoder(8 << 20)
        self.frames: list[Frame] = []
        self._feed(self.core.outbox)
        self.done: dict[str, Any] | None = None
        self.acked: list[tuple[int, int]] = []

    def _feed(self, out: list[bytes]) -> None:
        for blob in out:
            self.frames.extend(self.inbox.feed(blob))
        out.clear()

    def readable(self) -> bool:
        return bool(self.frames)

    def recv(self, timeout: float | None = None) -> Frame | None:
        return self.frames.pop(0) if self.frames else None

    def send(self, *parts: bytes | bytearray | memoryview) -> None:
        for frame in FrameDecoder(8 << 20).feed(b"".join(bytes(p) for p in parts)):
            if frame.type is FrameType.ACK:
                self.acked += [(f, k) for f, k in _pairs(frame)]
                continue
            for ev in self.core.handle(frame):
                if isinstance(ev, Accepted):
                    self._all_chunks_then_commit()
                elif isinstance(ev, Done):
                    self.done = ev.summary
        self._feed(self.core.outbox)

    def _all_chunks_then_commit(self) -> None:
        roots = []
        for f, data in enumerate(self.datas):
            dig = codec.digest(data)
            head = chunk_frame_header(ChunkHeader(f, 0, len(data), 0, dig), len(data))
            self.frames.extend(self.inbox.feed(head + data))
            roots.append(codec.root_digest([dig]).hex())
        self.core.commit(roots)

    def close(self) -> None:
        pass


def _pairs(frame: Frame) -> list[tuple[int, int]]:
    return parse_pairs(frame.body)


def test_syncs_for_many_small_files_are_bounded_by_batches_not_files(
    tmp_path: Path, syncs: Counter[str]
) -> None:
    """300 files of 2 KB through the real receiver glue, store and disk: the flushes it makes do
    not grow with the number of files (the old receiver: ~2,100)."""
    m, datas = _small_manifest(300)
    rc = Receiver(tmp_path / "dst", TOKEN)
    ch = _ScriptedSender(m, datas)
    try:
        rc.handle_channel(ch)
    finally:
        rc.close()
    assert ch.done is not None and ch.done.get("verified"), ch.done
    assert sorted(ch.acked) == [(f, 0) for f in range(300)]  # every chunk acknowledged, once
    for entry, data in zip(m.files, datas, strict=True):
        assert (tmp_path / "dst" / entry.name).read_bytes() == data
    total = sum(syncs.values())
    # plan (manifest state file), one batch (2 syncfs), placement (commit marker, 2 syncfs, done
    # marker, forget): about a dozen, whatever the number of files
    assert total <= 20, syncs
    assert syncs["fdatasync"] == 0, syncs


def test_placing_many_files_syncs_a_constant_number_of_times(tmp_path: Path, syncs: Counter[str]) -> None:
    """Store level: the same flushes place 40 files as 400."""
    counts = []
    for n in (40, 400):
        m, datas = _small_manifest(n)
        store = Store(tmp_path / f"d{n}")
        plan = store.plan(m)
        for f, data in enumerate(datas):
            plan.write(f, 0, data)
        plan.make_durable([(f, 0, codec.digest(d)) for f, d in enumerate(datas)])
        syncs.clear()
        plan.finalize([codec.root_digest([codec.digest(d)]).hex() for d in datas], overwrite=False)
        counts.append(sum(syncs.values()))
        store.close()
        for entry, data in zip(m.files, datas, strict=True):
            assert (tmp_path / f"d{n}" / entry.name).read_bytes() == data
    assert counts[0] == counts[1] and counts[1] <= 12, counts


def test_one_big_file_keeps_its_own_fdatasync_not_syncfs(tmp_path: Path, syncs: Counter[str]) -> None:
    """A batch inside one file flushes only that file (syncfs would flush every other writer on
    the file system too): fdatasync + the journal's fsync, as before."""
    data = os.urandom(3 * CS)
    entry = FileEntry(name="big.bin", size=len(data), mode=0o644, key=file_key("big", len(data), 1, 1, CS))
    m = make_manifest(CS, [entry])
    store = Store(tmp_path)
    plan = store.plan(m)
    syncs.clear()
    for k in range(3):
        plan.write(0, k, data[k * CS : (k + 1) * CS])
    plan.make_durable([(0, k, codec.digest(data[k * CS : (k + 1) * CS])) for k in range(3)])
    assert syncs == Counter({"fdatasync": 1, "fsync": 1}), syncs
    plan.close()
    store.close()


def _eio_once(monkeypatch: pytest.MonkeyPatch, target: Any, name: str) -> list[int]:
    """Makes `target.name` (a flush) fail once with EIO, as a flush told of a write-back error does."""
    real = getattr(target, name)
    calls: list[int] = []

    def failing(fd: int) -> Any:
        calls.append(fd)
        if len(calls) == 1:
            raise OSError(errno.EIO, "Input/output error")
        return real(fd)

    monkeypatch.setattr(target, name, failing)
    return calls


def test_a_write_back_error_told_to_one_channel_keeps_the_others_chunks_unrecorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Linux tells each open file of a write-back error once: channel A's fdatasync gets EIO, and
    channel B's, on a descriptor opened after, returns 0 although B's chunk was written before the
    error and may be lost with it. B's batch must fail too, not journal the chunk as durable."""
    data = os.urandom(2 * CS)
    entry = FileEntry(name="big.bin", size=len(data), mode=0o644, key=file_key("big", len(data), 1, 1, CS))
    plan = Store(tmp_path).plan(make_manifest(CS, [entry]))
    plan.write(0, 0, data[:CS])  # channel A's chunk
    plan.write(0, 1, data[CS:])  # channel B's, before the error
    _eio_once(monkeypatch, os, "fdatasync")
    dig = [codec.digest(data[:CS]), codec.digest(data[CS:])]
    with pytest.raises(OSError, match="Input/output"):
        plan.make_durable([(0, 0, dig[0])])
    with pytest.raises(OSError, match="write-back error"):
        plan.make_durable([(0, 1, dig[1])])  # its own fdatasync said 0
    assert not plan.has(0, 1) and not plan.files[0].journal.reload()
    plan.write(0, 1, data[CS:])  # sent again: written after the error, it counts
    plan.make_durable([(0, 1, dig[1])])
    assert plan.has(0, 1) and list(plan.files[0].journal.reload()) == [1]


def test_a_write_back_error_told_to_one_syncfs_batch_fails_the_other_batch_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    m, datas = _small_manifest(8)
    plan = Store(tmp_path).plan(m)
    for f, d in enumerate(datas):
        plan.write(f, 0, d)
    _eio_once(monkeypatch, store_mod, "_syncfs")
    recs = [(f, 0, codec.digest(d)) for f, d in enumerate(datas)]
    with pytest.raises(OSError, match="Input/output"):
        plan.make_durable(recs[:4])
    with pytest.raises(OSError, match="write-back error"):
        plan.make_durable(recs[4:])
    assert not any(plan.has(f, 0) for f in range(8))


# -- kill -9 in the middle of a batch of small files, then the same send again ----------------------


def _tree(root: Path, n: int, size: int) -> Path:
    src = root / "shards"
    for i in range(n):
        d = src / f"rank{i % 8}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"t{i:04d}.bin").write_bytes(os.urandom(size))
    return src


def _acked_files(dest: Path) -> int:
    """Files whose journal holds a record (durable and acknowledged, or about to be)."""
    part = dest / ".rq-partial"
    if not part.exists():
        return 0
    return sum(1 for j in part.glob("*.journal") if j.stat().st_size >= 32 + 24)


@pytest.mark.timeout(120)
def test_receiver_killed_mid_batch_of_small_files_resumes_without_resending(tmp_path: Path) -> None:
    """kill -9 of `rq recv` while 1,500 small files arrive in group-committed batches; the re-run
    completes, every file identical, and sends again at most what was not yet durable (never a
    chunk the journal holds)."""
    n = 1500
    src = _tree(tmp_path, n, 3000)
    dest, certs = tmp_path / "dst", tmp_path / "certs"
    rcv = Recv(dest, certs, "tcp").start()
    sender = subprocess.Popen(
        rq_cmd("send", str(src), rcv.url, *rcv.send_args(), "--json", "--retry-for", "2"),
        env=rq_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert wait_for(lambda: _acked_files(dest) >= n // 10, timeout=60, step=0.005), (
            "no batch became durable"
        )
        rcv.kill()  # mid-transfer: a batch is being written or synced right now
    finally:
        sender.kill()
        sender.wait()
    kept = _acked_files(dest)
    assert 0 < kept < n, kept
    assert not (dest / "shards").exists()  # nothing placed before COMMIT

    rcv2 = Recv(dest, certs, "tcp").start()
    try:
        proc = send([src], rcv2)
        assert proc.returncode == 0, proc.stderr.decode()
        s = summary(proc)
    finally:
        rcv2.stop()
    assert tree_digest(dest / "shards") == tree_digest(src)
    # only what the journal did not hold moved again
    assert s["chunks_sent"] == n - kept, (s["chunks_sent"], n, kept)
    leftovers = [p.name for p in (dest / ".rq-partial").iterdir() if p.name.endswith((".part", ".tmp"))]
    assert not leftovers, leftovers[:5]


def test_a_torn_batch_of_placed_records_is_redone_by_the_rerun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A receiver killed after linking a batch of files but before the done marker was written
    (their placed records go down before the links now): the re-run finishes the commit (the
    commit marker is the redo log) and records every file, each in place once."""
    m, datas = _small_manifest(50)
    store = Store(tmp_path)
    plan = store.plan(m)
    for f, data in enumerate(datas):
        plan.write(f, 0, data)
    plan.make_durable([(f, 0, codec.digest(d)) for f, d in enumerate(datas)])

    class Killed(Exception):
        pass

    write_state_file = Store._write_state_file

    def die(self: Store, name: str, *a: Any, **k: Any) -> None:
        if name.endswith(".done.json"):
            raise Killed
        write_state_file(self, name, *a, **k)

    monkeypatch.setattr(Store, "_write_state_file", die)
    with pytest.raises(Killed):
        plan.finalize([codec.root_digest([codec.digest(d)]).hex() for d in datas], overwrite=False)
    monkeypatch.undo()
    store.close()
    assert all((tmp_path / e.name).exists() for e in m.files)  # linked, no done marker

    store = Store(tmp_path)
    assert store.completed(m)  # the re-run's question: the commit is finished, not refused
    for entry, data in zip(m.files, datas, strict=True):
        assert (tmp_path / entry.name).read_bytes() == data
    state = tmp_path / ".rq-partial"
    assert len(list(state.glob("*.placed"))) == 50
    assert not list(state.glob("*.part")) and not list(state.glob("*.commit.json"))
    store.close()


def test_concurrent_small_file_transfers_share_nothing_they_should_not(tmp_path: Path) -> None:
    """Two transfers of small files into one receiver at once (their batches' syncfs calls
    overlap): both complete, identical."""
    a, b = _tree(tmp_path / "a", 200, 1500), _tree(tmp_path / "b", 200, 1700)
    (tmp_path / "b" / "shards").rename(tmp_path / "b" / "other")
    b = tmp_path / "b" / "other"
    dest = tmp_path / "dst"
    rcv = Recv(dest, tmp_path / "certs", "tcp").start()
    results: list[int] = []
    try:
        threads = [
            threading.Thread(target=lambda s=s: results.append(send([s], rcv).returncode)) for s in (a, b)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
    finally:
        rcv.stop()
    assert results == [0, 0]
    assert tree_digest(dest / "shards") == tree_digest(a)
    assert tree_digest(dest / "other") == tree_digest(b)
