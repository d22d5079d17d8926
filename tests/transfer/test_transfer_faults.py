"""Faults and hostile peers: kill -9 at random points, bit flips in flight, a full disk, a changed source,
a lossy high-latency link (netns + netem), and a sender that speaks the protocol to attack the receiver."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import random
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zstandard
from rqtest import popen_rq_with, veth_namespace
from xfer_kit import (
    Recv,
    Relay,
    control_channel,
    free_port,
    journal_records,
    manifest_reply,
    quic_recv_in_namespace,
    reply,
    rq_cmd,
    rq_env,
    send,
    summary,
    wait_for,
)

from transfer import codec, journal
from transfer.frames import ChunkHeader, FrameType, chunk_frame_header, header
from transfer.manifest import FileEntry, Manifest, file_key, make_manifest
from transfer.tcp import TcpChannel

pytestmark = pytest.mark.integration

QUIC_SLOW = ["--transport", "quic", "--quic-backend", "aioquic", "--datagram-size", "1400"]
# Small datagrams and chunks keep aioquic slow enough that a test can kill a side mid-transfer.
SLOW_RECV = ("--quic-backend", "aioquic", "--datagram-size", "1400")
SLOW_SEND = (*SLOW_RECV, "--chunk-size", "256KiB", "--transport", "quic")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# Reader.read in the sender's process, held for good after its first `reads` calls: a test that
# kills the sender "mid-transfer" must not race the transfer's end (on a slow runner the test's
# poll can come late enough for the last chunks to go out first).
_HOLD_READS = """
import threading
from transfer import source
_read, _lock, _count = source.Reader.read, threading.Lock(), [0]
def read(self, f, k, length):
    with _lock:
        _count[0] += 1
        held = _count[0] > {reads}
    if held:
        threading.Event().wait()  # until the test kills this process
    return _read(self, f, k, length)
source.Reader.read = read
"""


# Reader.read in the sender's process, held while the chunk asked for is at or past the number in
# the file `limit` (the test moves it on), saying so in `limit`.held (the number it waits past): the
# receiver can hold no more than that many chunks, so a test can wait for a kill point and find
# the transfer still under way, however slow its polls.
_GATE_READS = """
import os, threading, time
from transfer import source
_read = source.Reader.read
def read(self, f, k, length):
    while k >= (limit := int(open({limit!r}).read())):
        # a temp name of this thread's own: the sender's connections read on threads of their own,
        # and one truncating the temp file another was about to rename left `.held` empty
        tmp = {limit!r} + f".held.{{os.getpid()}}.{{threading.get_ident()}}"
        with open(tmp, "w") as held:
            held.write(str(limit))
        os.replace(tmp, {limit!r} + ".held")
        time.sleep(0.01)
    return _read(self, f, k, length)
source.Reader.read = read
"""


def _sender(
    src: Path,
    url: str,
    pin: str | None,
    *extra: str,
    hold_after: int | None = None,
    limit: Path | None = None,
) -> subprocess.Popen[bytes]:
    args = ["send", str(src), url, "--json", "--retry-for", "30", *extra]
    if pin:
        args += ["--pin", pin]
    if hold_after is not None:
        return popen_rq_with(_HOLD_READS.format(reads=hold_after), *args, env=rq_env())
    if limit is not None:
        return popen_rq_with(_GATE_READS.format(limit=str(limit)), *args, env=rq_env())
    return subprocess.Popen(rq_cmd(*args), env=rq_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)


# -- kill -9 at random points ---------------------------------------------------------------------


def _set_limit(limit: Path, chunks: int) -> None:
    """The sender may read chunks below `chunks` (see _GATE_READS); replaced whole, never half-written."""
    part = limit.with_name(limit.name + ".new")
    part.write_text(str(chunks))
    os.replace(part, limit)


def _held_at(limit: Path) -> int:
    """The limit the sender last waited at (0: none yet)."""
    try:
        return int(limit.with_name(limit.name + ".held").read_text())
    except FileNotFoundError:
        return 0


@pytest.mark.slow
def test_kill9_sender_and_receiver_at_random_points_then_identical(tmp_path: Path) -> None:
    """Every kill lands mid-transfer: the sender reads no chunk past the next kill point (+4; every
    point is below 88 of 96 chunks), so the transfer cannot end before it. The kill comes when the
    receiver's journal reaches the point, or when the sender waits at that limit (chunks it sent
    that the receiver has not made durable yet may keep the journal a few short)."""
    src = tmp_path / "model.bin"
    src.write_bytes(os.urandom(24 << 20))
    dest = tmp_path / "dst"
    port = free_port(socket.SOCK_DGRAM)
    recv = Recv(dest, tmp_path / "cert", "quic", *SLOW_RECV, port=port).start()
    extra = SLOW_SEND
    rng = random.Random(int.from_bytes(os.urandom(4), "big"))
    points = sorted(rng.sample(range(3, 88), 10))  # chunk records on the receiver's journal (96 chunks)
    limit = tmp_path / "limit"
    _set_limit(limit, points[0] + 4)
    sender = _sender(src, recv.url, recv.pin, *extra, limit=limit)
    kills = []
    try:
        for i, point in enumerate(points):
            at = points[i] + 4
            reached = wait_for(lambda p=point, a=at: journal_records(dest) >= p or _held_at(limit) >= a, 60)  # type: ignore[misc]
            assert reached and sender.poll() is None, (point, journal_records(dest), kills)
            if i % 2 == 0:
                sender.kill()
                sender.wait()
                kills.append(("sender", journal_records(dest)))
            else:
                recv.kill()
                kills.append(("receiver", journal_records(dest)))
            _set_limit(limit, points[i + 1] + 4 if i + 1 < len(points) else 1 << 30)
            if i % 2 == 0:
                sender = _sender(src, recv.url, recv.pin, *extra, limit=limit)
            else:
                recv = Recv(dest, tmp_path / "cert", "quic", *SLOW_RECV, port=port).start()
        _out, err = sender.communicate(timeout=120)
        assert sender.returncode == 0, err.decode()
    finally:
        if sender.poll() is None:
            sender.kill()
        recv.stop()
    assert len(kills) == len(points), kills
    assert _sha(dest / "model.bin") == _sha(src)
    assert not list((dest / ".rq-partial").glob("*.part"))


def test_resume_after_receiver_kill_moves_only_missing_chunks(tmp_path: Path) -> None:
    src = tmp_path / "model.bin"
    size, cs = 16 << 20, 256 << 10
    src.write_bytes(os.urandom(size))
    dest = tmp_path / "dst"
    recv = Recv(dest, tmp_path / "cert", "quic", *SLOW_RECV).start()
    extra = SLOW_SEND
    sender = _sender(src, recv.url, recv.pin, *extra, hold_after=40)  # of 64 chunks
    try:
        assert wait_for(lambda: journal_records(dest) >= 30, 60)
        recv.kill()
        sender.kill()
        sender.wait()
        have = journal_records(dest)
        assert have < size // cs
        recv = Recv(dest, tmp_path / "cert", "quic", "--quic-backend", "aioquic", "--once").start()
        proc = subprocess.run(
            rq_cmd(
                "send",
                str(src),
                recv.url,
                "--pin",
                str(recv.pin),
                "--json",
                *extra,
                "--datagram-size",
                "16000",
            ),
            env=rq_env(),
            capture_output=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr.decode()
        s = summary(proc)
    finally:
        if sender.poll() is None:
            sender.kill()
        recv.stop()
    streams = 2
    assert s["bytes_raw"] <= size - have * cs + 2 * streams * cs
    assert s["bytes_raw"] < size
    assert _sha(dest / "model.bin") == _sha(src)


def test_changed_source_restarts_instead_of_mixing(tmp_path: Path) -> None:
    src = tmp_path / "model.bin"
    src.write_bytes(os.urandom(8 << 20))
    dest = tmp_path / "dst"
    recv = Recv(dest, tmp_path / "cert", "quic", *SLOW_RECV).start()
    extra = SLOW_SEND
    try:
        sender = _sender(src, recv.url, recv.pin, *extra, hold_after=12)  # of 32 chunks
        assert wait_for(lambda: journal_records(dest) >= 6, 60)
        sender.kill()
        sender.wait()
        data = bytearray(src.read_bytes())
        data[:1000] = os.urandom(1000)  # same size, new content and mtime
        time.sleep(0.01)
        src.write_bytes(bytes(data))
        proc = send(
            [src], recv, "--chunk-size", "256KiB", "--datagram-size", "16000", "--quic-backend", "aioquic"
        )
        assert proc.returncode == 0, proc.stderr.decode()
    finally:
        _rc, out, _err = recv.stop()
    assert _sha(dest / "model.bin") == _sha(src)
    events = [json.loads(x) for x in out.splitlines() if x.strip()]
    assert any(e.get("event") == "transfer" and e.get("restarted") == ["model.bin"] for e in events), out


# -- bit flips in flight -------------------------------------------------------------------------


class FlipProxy(Relay):
    """A TCP proxy that flips one bit, once, at a fixed offset of the sender→receiver byte stream."""

    def __init__(self, target_port: int, offset: int, every: int = 0):
        self.offset, self.every = offset, every
        self.flipped = threading.Event()
        super().__init__(target_port)

    def carry(self, data: bytes, seen: int) -> bytes:
        target = self.offset
        if self.every:  # a broken link: it corrupts again and again, every `every` bytes
            target += max(0, (seen - self.offset + self.every - 1) // self.every) * self.every
        if (self.every or not self.flipped.is_set()) and seen <= target < seen + len(data):
            buf = bytearray(data)
            buf[target - seen] ^= 0x10
            self.flipped.set()
            return bytes(buf)
        return data


def test_bit_flip_in_flight_is_detected_and_resent(tmp_path: Path) -> None:
    src = tmp_path / "model.bin"
    src.write_bytes(os.urandom(6 << 20))
    recv = Recv(tmp_path / "dst", tmp_path / "cert", "tcp", "--once").start()
    proxy = FlipProxy(recv.port, (2 << 20) + 777)  # inside the third 1 MiB chunk's payload
    try:
        proc = subprocess.run(
            rq_cmd(
                "send",
                str(src),
                f"rq://127.0.0.1:{proxy.port}",
                "--transport",
                "tcp",
                "--json",
                "--chunk-size",
                "1MiB",
                "--compress",
                "none",
                "--streams",
                "1",
            ),
            env=rq_env(),
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr.decode()
    finally:
        proxy.close()
        recv.stop()
    assert proxy.flipped.is_set()
    assert summary(proc)["chunks_resent"] >= 1
    assert _sha(tmp_path / "dst" / "model.bin") == _sha(src)


def test_link_that_corrupts_everything_fails_with_verify_exit_code(tmp_path: Path) -> None:
    src = tmp_path / "model.bin"
    src.write_bytes(os.urandom(3 << 20))
    recv = Recv(tmp_path / "dst", tmp_path / "cert", "tcp").start()
    frame = (256 << 10) + 37  # one CHUNK frame on the wire: flips stay mid-payload, frame after frame
    proxy = FlipProxy(recv.port, 4 * frame + (128 << 10), every=frame)
    try:
        proc = subprocess.run(
            rq_cmd(
                "send",
                str(src),
                f"rq://127.0.0.1:{proxy.port}",
                "--transport",
                "tcp",
                "--chunk-size",
                "256KiB",
                "--compress",
                "none",
                "--streams",
                "1",
                "--retry-for",
                "5",
            ),
            env=rq_env(),
            capture_output=True,
            timeout=60,
            check=False,
        )
    finally:
        proxy.close()
        recv.stop()
    assert proc.returncode == 5, proc.stderr.decode()
    assert not (tmp_path / "dst" / "model.bin").exists()


# -- disk full -----------------------------------------------------------------------------------


@dataclasses.dataclass
class SmallDisk:
    """A small file system that fills up, and a way to free space on it afterwards."""

    path: Path
    free: Callable[[], None]


def _mount_tmpfs(mnt: Path) -> SmallDisk | None:
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=5m", "tmpfs", str(mnt)], capture_output=True
    ).returncode:
        return None

    def grow() -> None:
        subprocess.run(["mount", "-o", "remount,size=40m", str(mnt)], check=True)

    return SmallDisk(mnt, grow)


def _mount_ext4(mnt: Path, image: Path) -> SmallDisk | None:
    """ext4 on a loop device: the receiver writes there with O_DIRECT, where ENOSPC comes from a
    direct write, not from the page cache."""
    with open(image, "wb") as fh:
        fh.truncate(48 << 20)
    made = subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(image)], capture_output=True)
    if (
        made.returncode
        or subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], capture_output=True).returncode
    ):
        return None
    filler = mnt / "filler"
    left = os.statvfs(mnt).f_bavail * os.statvfs(mnt).f_frsize
    with open(filler, "wb") as fh:  # leave ~5 MiB, like the tmpfs
        fh.write(b"\0" * max(0, left - (5 << 20)))
        os.fsync(fh.fileno())
    return SmallDisk(mnt, lambda: filler.unlink())


@pytest.fixture(params=["tmpfs", "ext4"])
def small_disk(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SmallDisk]:
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root")
    disk = _mount_tmpfs(mnt) if request.param == "tmpfs" else _mount_ext4(mnt, tmp_path / "ext4.img")
    if disk is None:
        pytest.skip(f"cannot mount a small {request.param} here")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, check=False)


def test_disk_full_then_resume_after_space_is_freed(tmp_path: Path, small_disk: SmallDisk) -> None:
    src = tmp_path / "model.bin"
    src.write_bytes(os.urandom(8 << 20))
    dest = small_disk.path / "dst"
    recv = Recv(dest, tmp_path / "cert", "tcp").start()
    try:
        proc = send([src], recv, "--compress", "none", "--chunk-size", "256KiB")
        assert proc.returncode == 7, proc.stderr.decode()
        errors = [line for line in proc.stderr.decode().splitlines() if line.startswith("rq: error:")]
        assert len(errors) == 1 and "full" in errors[0]
        assert not (dest / "model.bin").exists()
        (jfile,) = (dest / ".rq-partial").glob("*.journal")
        have = journal.parse(jfile.read_bytes(), jfile.stem, 8 << 20, 256 << 10, 32)
        assert have, "the journal keeps what was verified before the disk filled"
        small_disk.free()
        proc = send([src], recv, "--compress", "none", "--chunk-size", "256KiB")
        assert proc.returncode == 0, proc.stderr.decode()
        assert summary(proc)["bytes_raw"] <= (8 << 20) - len(have) * (256 << 10) + 4 * (256 << 10)
    finally:
        recv.stop()
    assert _sha(dest / "model.bin") == _sha(src)


def test_reservations_never_take_the_last_of_the_disk(tmp_path: Path, small_disk: SmallDisk) -> None:
    """Manifests alone (no chunk sent) made the receiver reserve their files until the disk was
    full, and on ext4 a reservation that failed kept what it got (found by review). Now a file is
    reserved only if the file system keeps its margin free after it, and a failed call is undone."""
    from transfer.store import Store

    dest = small_disk.path / "dst"
    store = Store(dest)
    vfs = os.statvfs(dest)
    margin = min(vfs.f_blocks * vfs.f_frsize // 20, 1 << 30)
    size = 3 << 19  # 1.5 MiB: above the 1 MiB below which nothing is reserved
    reserved = []
    for n in range(6):
        name = f"f{n}.bin"
        m = make_manifest(
            64 << 10, [FileEntry(name=name, size=size, mode=0o644, key=file_key(name, size, n, 1, 64 << 10))]
        )
        plan = store.plan(m)
        if plan.reservation is not None:  # tmpfs: reserved in a thread, which close() stops
            plan.reservation.wait()
        plan.close()
        part = dest / ".rq-partial" / f"{m.files[0].key}.part"
        reserved.append(part.stat().st_blocks * 512 >= size)
        left = os.statvfs(dest)
        assert left.f_bavail * left.f_frsize >= margin - (64 << 10), f"manifest {n} took the margin"
    assert reserved[0] and not all(reserved)  # the first fits; then the margin stops them
    too_big = make_manifest(
        64 << 10,
        [FileEntry(name="big", size=64 << 20, mode=0o644, key=file_key("big", 64 << 20, 9, 9, 64 << 10))],
    )
    before = os.statvfs(dest).f_bavail
    store.plan(too_big).close()
    # nothing reserved for it (64 MiB): only a few metadata blocks (the journal, the .owner record,
    # a state directory that grew by a block on 1 KiB-block ext4)
    assert os.statvfs(dest).f_bavail >= before - 8
    store.close()


@contextlib.contextmanager
def _immutable(path: Path) -> Iterator[None]:
    """chattr +i: even root cannot create files in it (a read-only mode bit would not stop root)."""
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True, check=False).returncode:
        pytest.skip("chattr +i is not supported here")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], capture_output=True, check=False)


def test_receiver_disk_error_is_reported_not_taken_for_a_lost_peer(tmp_path: Path) -> None:
    """EPERM writing the manifest on the receiver closed the channel silently: the sender retried
    and ended with exit 6, "is rq recv running there?". Now the sender gets the receiver's strerror
    in an ERROR frame (exit 1) and rq recv prints one line about it."""
    src = tmp_path / "model.bin"
    src.write_bytes(os.urandom(100_000))
    dest = tmp_path / "dst"
    (dest / ".rq-partial").mkdir(parents=True)
    with _immutable(dest / ".rq-partial"):
        recv = Recv(dest, tmp_path / "cert", "tcp").start()
        try:
            proc = send([src], recv, "--retry-for", "5")
        finally:
            _, _, recv_err = recv.stop()
    err = proc.stderr.decode()
    assert proc.returncode == 1, err
    assert "Operation not permitted" in err and "is `rq recv` running there" not in err, err
    assert str(tmp_path) not in err  # the receiver's own paths stay on the receiver
    refused = [line for line in recv_err.splitlines() if "refused a transfer" in line]
    assert len(refused) == 1 and "Operation not permitted" in refused[0], recv_err


def test_receiver_disk_errors_name_the_kind_and_keep_paths_inside_dest(tmp_path: Path) -> None:
    import errno

    from transfer.errors import NoSpaceError, TransferError
    from transfer.receiver import Receiver

    rc = Receiver(tmp_path / "dst", b"t")
    try:
        full = rc._disk_error(
            OSError(errno.EDQUOT, "Disk quota exceeded", str(tmp_path / "dst" / "a" / "b")), None
        )
        assert isinstance(full, NoSpaceError) and "'a/b': Disk quota exceeded" in str(full)
        ro = rc._disk_error(OSError(errno.EROFS, "Read-only file system", "/elsewhere/x\x1b[2J"), None)
        assert type(ro) is TransferError and str(tmp_path) not in str(ro) and "\x1b" not in str(ro)
    finally:
        rc.close()


# -- a hostile sender ----------------------------------------------------------------------------


def _forged(names: list[str], size: int = 1000, chunk: int = 1 << 16) -> Manifest:
    """A manifest with any names at all (make_manifest would not validate them; the receiver must)."""
    files = [
        FileEntry(name=n, size=size, mode=0o644, key=file_key(n, size, 1, i, chunk))
        for i, n in enumerate(names)
    ]
    return make_manifest(chunk, files)


def _chunk_after_accept(port: int, m: Manifest, h: ChunkHeader, payload: bytes) -> dict[str, Any]:
    ch = control_channel(port, m.transfer_id)
    body = m.to_json()
    ch.send(header(FrameType.MANIFEST, len(body)), body)
    frame = ch.recv(10)
    assert frame is not None and frame.type is FrameType.ACCEPT
    ch.send(chunk_frame_header(h, len(payload)), payload)
    return reply(ch)


def test_hostile_sender_is_refused_and_receiver_stays_up(tmp_path: Path) -> None:
    dest, outside = tmp_path / "dst", tmp_path / "outside"
    dest.mkdir()
    outside.mkdir()
    (dest / "link").symlink_to(outside)
    recv = Recv(dest, tmp_path / "cert", "tcp", "--max-files", "50", "--max-bytes", "10M").start()
    port = recv.port
    try:
        # names that would escape DEST, or go through a symlink planted in it
        for name in ["../escape", f"{outside}/abs", "a/../../escape", "link/evil", "a\\..\\evil", "x\x1b[2J"]:
            answer = manifest_reply(port, _forged([name]).to_json())
            assert answer["type"] == "ERROR" and answer["code"] in ("unsafe-name", "protocol"), (name, answer)
        # too many files, too many bytes, a manifest frame bigger than any allowed
        assert manifest_reply(port, _forged([f"f{i}" for i in range(51)]).to_json())["code"] == "limit"
        assert manifest_reply(port, _forged(["big"], size=11 << 20).to_json())["code"] == "limit"
        ch = control_channel(port, "0" * 32)
        ch.send(header(FrameType.MANIFEST, 1 << 30))
        assert reply(ch)["code"] == "protocol"
        # before authenticating, a peer cannot make the receiver buffer more than 64 KiB
        raw = TcpChannel(socket.create_connection(("127.0.0.1", port), timeout=10), 1 << 26)
        raw.send(header(FrameType.HELLO, 1 << 20))
        assert reply(raw)["code"] == "protocol"
        # chunks that do not exist, or claim more bytes than their place in the file holds
        m = _forged(["ok.bin"], size=100_000)
        data = os.urandom(1 << 16)
        for h in [
            ChunkHeader(0, 7, len(data), 0, codec.digest(data)),
            ChunkHeader(3, 0, len(data), 0, codec.digest(data)),
            ChunkHeader(0, 1, len(data), 0, codec.digest(data)),
        ]:
            assert _chunk_after_accept(port, m, h, data)["code"] == "protocol", h
        # a chunk that decompresses past its declared size: refused (NACK), nothing written
        bomb = zstandard.ZstdCompressor().compress(b"\0" * (64 << 20))
        answer = _chunk_after_accept(port, m, ChunkHeader(0, 0, 1 << 16, codec.Codec.ZSTD, b"\0" * 16), bomb)
        assert answer["type"] == "NACK"
        # the wrong token, and a data channel for a transfer that does not exist
        ch = control_channel(port, m.transfer_id, token="guess")
        assert reply(ch)["code"] == "auth"
        ch = control_channel(port, "f" * 32, role="data")
        assert reply(ch)["code"] == "unknown-transfer"
        # and after all that, an honest sender still gets through
        src = tmp_path / "honest.bin"
        src.write_bytes(os.urandom(300_000))
        proc = send([src], recv)
        assert proc.returncode == 0, proc.stderr.decode()
    finally:
        _rc, out, err = recv.stop()
    assert list(outside.iterdir()) == []
    assert not (tmp_path / "escape").exists()
    assert sorted(p.name for p in dest.iterdir()) == [".rq-partial", "honest.bin", "link"]
    assert (dest / "honest.bin").read_bytes() == src.read_bytes()
    assert "\x1b" not in err  # names are escaped before they reach a terminal
    assert out.count('"event":"refused"') >= 10


# -- loss and latency (netns + veth + netem) ------------------------------------------------------


class LossyRelay:
    """Userspace stand-in for netem where the kernel lacks sch_netem: relays UDP both ways, dropping
    `loss` of the datagrams and holding each for `delay` seconds (so RTT = 2 × delay)."""

    def __init__(self, bind_host: str, target: tuple[str, int], delay: float, loss: float, seed: int = 7):
        import heapq
        import select

        self._heapq, self._select = heapq, select
        self.front = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.front.bind((bind_host, 0))
        self.back = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.back.bind((bind_host, 0))
        self.port = self.front.getsockname()[1]
        self.target, self.delay, self.loss = target, delay, loss
        self.rng = random.Random(seed)
        self.client: tuple[str, int] | None = None
        self.queue: list[tuple[float, int, socket.socket, bytes, tuple[str, int]]] = []
        self.dropped = self.passed = 0
        self._stop = threading.Event()
        self._seq = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            while self.queue and self.queue[0][0] <= now:
                _, _, sock, data, addr = self._heapq.heappop(self.queue)
                with contextlib.suppress(OSError):
                    sock.sendto(data, addr)
            wait = min(0.05, max(0.0, self.queue[0][0] - now)) if self.queue else 0.05
            ready, _, _ = self._select.select([self.front, self.back], [], [], wait)
            for sock in ready:
                data, addr = sock.recvfrom(65535)
                if sock is self.front:
                    self.client, out, dest = addr, self.back, self.target
                else:
                    if self.client is None:
                        continue
                    out, dest = self.front, self.client
                if self.rng.random() < self.loss:
                    self.dropped += 1
                    continue
                self.passed += 1
                self._seq += 1
                self._heapq.heappush(self.queue, (time.monotonic() + self.delay, self._seq, out, data, dest))

    def close(self) -> None:
        self._stop.set()
        self.thread.join(timeout=2)
        self.front.close()
        self.back.close()


@pytest.fixture
def lossy_link() -> Iterator[dict[str, Any]]:
    """A network namespace joined by a veth pair; 20 ms each way and 1% loss with tc netem, or — where
    the kernel has no sch_netem (as on this VM) — with LossyRelay on the veth in front of the receiver."""
    with veth_namespace("rqx") as link:
        netem = ["root", "netem", "delay", "20ms", "loss", "1%"]
        has_netem = all(
            subprocess.run(c, capture_output=True, check=False).returncode == 0
            for c in (
                ["tc", "qdisc", "add", "dev", link.outer, *netem],
                ["ip", "netns", "exec", link.ns, "tc", "qdisc", "add", "dev", link.inner, *netem],
            )
        )
        yield {"ns": link.ns, "here": link.here, "there": link.there, "netem": has_netem}


@pytest.mark.netns
@pytest.mark.slow
def test_quic_over_lossy_high_latency_link(tmp_path: Path, lossy_link: dict[str, Any]) -> None:
    src = tmp_path / "model.bin"
    src.write_bytes(os.urandom(3 << 20))
    recv = quic_recv_in_namespace(tmp_path, lossy_link["ns"], lossy_link["there"], "aioquic")
    port = recv.port
    relay = (
        None
        if lossy_link["netem"]
        else LossyRelay(lossy_link["here"], (lossy_link["there"], port), 0.020, 0.01)
    )
    try:
        url = recv.url if relay is None else f"rq://{lossy_link['here']}:{relay.port}"
        proc = subprocess.run(
            rq_cmd(
                "send",
                str(src),
                url,
                "--pin",
                str(recv.pin),
                "--json",
                "--transport",
                "quic",
                "--quic-backend",
                "aioquic",
                "--chunk-size",
                "256KiB",
                "--datagram-size",
                "1452",
            ),
            env=rq_env(),
            capture_output=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr.decode()
        rc, _, err = recv.wait(30)
        assert rc == 0, err
    finally:
        recv.stop()
        if relay is not None:
            relay.close()
    if relay is not None:
        assert relay.dropped > 0  # the link really lost packets
    assert summary(proc)["verified"] is True
    assert _sha(tmp_path / "dst" / "model.bin") == _sha(src)
