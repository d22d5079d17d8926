"""Pure logic: names from keys, sizes, digests, the AIMD window, glob filters. No servers."""

from __future__ import annotations

import base64
import os
import re
import zlib
from pathlib import Path
from typing import Any

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st
from rqtest import libc_with_mmap

from cache.digests import (
    MIB,
    PIECE_SIZE,
    PieceHash,
    composite_crc32_matches,
    file_digest,
    tree_digest,
    whole_crc32,
)
from cache.errors import BadSourceError
from cache.fetcher import Window
from cache.layout import Layout, blob_name
from cache.preload import matches
from cache.sizes import parse_size

SAFE_BLOB = re.compile(r"^[0-9a-f]{2}/[0-9a-f]{32}-[A-Za-z0-9._-]{1,40}$")


@given(st.text(min_size=0, max_size=3000), st.text(max_size=50))
@settings(max_examples=300, deadline=None)
def test_any_key_maps_to_a_safe_name_inside_the_tier(key: str, version: str) -> None:
    blob = blob_name(f"s3://bucket/{key}", version)
    assert SAFE_BLOB.match(blob), blob
    assert not blob.split("-", 1)[1].startswith(".")
    layout = Layout(Path("/c"), Path("/r"))
    path = layout.blob_path("disk", blob)
    assert os.path.normpath(path) == str(path) and str(path).startswith("/c/objects/")


@pytest.mark.parametrize(
    "key", ["../../etc/passwd", "/abs/olute", "a/../../b", "..", ".", "x" * 5000, "日本語/ключ", "a\x00b\nc"]
)
def test_hostile_keys_never_leave_objects_dir(key: str) -> None:
    blob = blob_name(f"s3://b/{key}", "v1")
    assert SAFE_BLOB.match(blob)
    assert ".." not in blob.split("/")


def test_versions_get_distinct_names() -> None:
    assert blob_name("s3://b/k", "etag:1") != blob_name("s3://b/k", "etag:2")


def test_parse_size() -> None:
    assert parse_size("512M") == 512 << 20
    assert parse_size("4GiB") == 4 << 30
    assert parse_size("1.5K") == 1536
    assert parse_size("100") == 100
    with pytest.raises(BadSourceError):
        parse_size("lots")


def test_piece_hash_fed_in_odd_chunks_matches_one_shot() -> None:
    data = os.urandom(3 * MIB + 17)
    ph = PieceHash()
    view = memoryview(data)
    for start in range(0, len(data), 300_001):
        ph.update(view[start : start + 300_001])
    digest, blocks = ph.close()
    assert digest == xxhash.xxh3_128(data).hexdigest()
    assert whole_crc32(blocks, len(data)) == zlib.crc32(data)


def test_composite_crc32_of_multipart_upload() -> None:
    data = os.urandom(5 * MIB + 123)
    parts = [data[i : i + 2 * MIB] for i in range(0, len(data), 2 * MIB)]
    inner = b"".join(zlib.crc32(p).to_bytes(4, "big") for p in parts)
    expected = base64.b64encode(zlib.crc32(inner).to_bytes(4, "big")).decode() + "-3"
    assert composite_crc32_matches(_blocks(data), len(data), expected)
    flipped = bytearray(data)
    flipped[MIB] ^= 1
    assert not composite_crc32_matches(_blocks(bytes(flipped)), len(data), expected)


def _blocks(data: bytes) -> list[int]:
    ph = PieceHash()
    ph.update(memoryview(data))
    return ph.close()[1]


def test_file_digest_of_big_file_is_a_tree_of_pieces(tmp_path: Path) -> None:
    size = 2 * PIECE_SIZE + 5
    path = tmp_path / "big"
    with open(path, "wb") as fh:
        fh.truncate(size)
        fh.seek(PIECE_SIZE)
        fh.write(b"middle")
    fd = os.open(path, os.O_RDONLY)
    try:
        data = path.read_bytes()
        pieces = [xxhash.xxh3_128(data[o : o + PIECE_SIZE]).hexdigest() for o in range(0, size, PIECE_SIZE)]
        assert file_digest(fd, size) == tree_digest(pieces)
    finally:
        os.close(fd)


def test_window_halves_on_throttle_and_grows_back() -> None:
    w = Window(64)
    w.throttled()
    assert w.value == 32
    for _ in range(2000):
        w.success()
    assert w.value == 64


@pytest.mark.parametrize(
    ("crt_error", "retried"),
    [
        ("AWS_IO_SOCKET_CLOSED", True),  # a reset or a dropped keep-alive: this object's trouble
        ("AWS_ERROR_HTTP_CONNECTION_CLOSED", True),
        ("AWS_IO_SOCKET_CONNECTION_REFUSED", False),  # nobody listens: the run stops
        ("AWS_IO_SOCKET_TIMEOUT", False),
        ("AWS_IO_DNS_INVALID_NAME", False),
    ],
)
def test_a_lost_connection_is_retried_an_unreachable_store_is_not(crt_error: str, retried: bool) -> None:
    from awscrt.exceptions import AwsCrtError

    from cache.errors import OriginError, UnreachableError
    from cache.s3 import map_error

    err = map_error("s3://b/k", AwsCrtError(1, crt_error, "test"), None, None, "http://127.0.0.1:1")
    assert isinstance(err, UnreachableError) is not retried
    assert isinstance(err, OriginError) is retried
    assert not getattr(err, "throttled", False)


def test_workers_run_everything_submitted_before_shutdown_on_at_most_count_threads() -> None:
    import threading

    from cache.fetcher import Workers

    done: list[int] = []
    names: set[str] = set()
    lock = threading.Lock()

    def task(i: int) -> None:
        with lock:
            names.add(threading.current_thread().name)
        if i % 7 == 0:
            raise RuntimeError("a task's own error must not stop its worker")
        with lock:
            done.append(i)

    pool = Workers(3, "t")
    for i in range(200):
        pool.submit(task, i)
    pool.shutdown()
    pool.shutdown()  # twice is harmless
    assert sorted(done) == [i for i in range(200) if i % 7]
    assert 1 <= len(names) <= 3 and all(n.startswith("t_") for n in names)
    assert not any(t.name.startswith("t_") and t.is_alive() for t in threading.enumerate())


def test_include_exclude() -> None:
    assert matches("a/b.tar", ["*.tar"], [])
    assert not matches("a/b.json", ["*.tar"], [])
    assert not matches("a/b.tar", [], ["a/*"])
    assert matches("x", [], [])


@pytest.mark.parametrize("length", [4096, 3 * 4096 + 17, 100, (8 << 20) - 3])
def test_write_behind_lands_every_byte(tmp_path: Path, length: int) -> None:
    """Pieces go through O_DIRECT in aligned blocks, any unaligned tail through the buffered fd, on
    a writer thread; the file must read back byte-identical (buffered only where O_DIRECT is refused)."""
    from cache.directio import open_direct, write_behind

    path = tmp_path / "piece.part"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    dfd = open_direct(path)
    data = os.urandom(length)
    offset = 8192
    try:
        if dfd >= 0:
            write_behind().submit(dfd, fd, memoryview(data), offset).result()
        else:
            os.pwrite(fd, data, offset)
        os.fsync(fd)
    finally:
        os.close(fd)
        if dfd >= 0:
            os.close(dfd)
    assert path.read_bytes()[offset:] == data


def test_write_behind_reuses_a_bounded_set_of_buffers(tmp_path: Path) -> None:
    """Many more writes than buffers: all land, in their places, and no more buffers are made than
    the pool allows (fresh memory is slow here; RSS must stay bounded)."""
    from cache import directio

    path = tmp_path / "many.part"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    dfd = directio.open_direct(path)
    if dfd < 0:
        os.close(fd)
        pytest.skip("this file system refuses O_DIRECT")
    wb = directio.WriteBehind()
    blocks = [bytes([i]) * (64 * 1024) for i in range(40)]
    try:
        futures = [wb.submit(dfd, fd, memoryview(b), i * len(b)) for i, b in enumerate(blocks)]
        for f in futures:
            f.result()
    finally:
        os.close(fd)
        os.close(dfd)
    assert path.read_bytes() == b"".join(blocks)
    assert wb._made <= directio._BUFFERS


def _piece_landing(tmp_path: Path, size: int) -> Any:
    from cache.landing import Landing, ObjectInfo
    from cache.layout import Layout

    layout = Layout(tmp_path / "c", tmp_path / "r")
    (tmp_path / "c" / "tmp").mkdir(parents=True)
    info = ObjectInfo("s3://b/k", "k", size, "etag:x;size:1", "x")
    return Landing(layout, "disk", info, "bl/ob", hold_id=1, pieces=2, piece_size=size // 2)


def test_a_failed_write_behind_is_raised_only_after_every_write_of_the_piece_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One slice fails; piece_done must still wait for the others (none may run after its
    descriptor closed, which a reused fd number would turn into bytes in another file)."""
    import threading

    from cache import directio

    landing = _piece_landing(tmp_path, 4 * directio.CHUNK)
    if landing._dfd < 0:
        pytest.skip("this file system refuses O_DIRECT")
    release = threading.Event()
    calls: list[int] = []
    real = directio.WriteBehind._write

    def slow_or_failing(self: Any, buf: Any, dfd: int, fd: int, length: int, offset: int) -> None:
        calls.append(offset)
        if offset == 0:
            self._free.put(buf)
            raise OSError(5, "injected I/O error")
        release.wait(60)  # (set by the timer below; a shorter wait could outlast a loaded runner's 0.3 s)
        real(self, buf, dfd, fd, length, offset)

    monkeypatch.setattr(directio.WriteBehind, "_write", slow_or_failing)
    landing.write(memoryview(bytes(2 * directio.CHUNK)), 0)  # piece 0, two slices
    threading.Timer(0.3, release.set).start()
    with pytest.raises(OSError, match="injected"):
        landing.piece_done(0)
    assert release.is_set(), "piece_done returned before the slow slice finished"
    landing.abort()


def test_a_late_callback_after_close_writes_nothing(tmp_path: Path) -> None:
    """A cancelled request's last on_body may arrive after the landing was given up: it must not
    reopen (O_TRUNC) the partial file that a later run resumes from."""
    from cache import directio

    landing = _piece_landing(tmp_path, 4 * directio.CHUNK)
    landing.write(memoryview(b"\x01" * directio.CHUNK), 0)
    landing.piece_done(0)
    size_before = landing.tmp.stat().st_size
    landing.keep_for_resume()
    landing.write(memoryview(b"\x02" * 4096), directio.CHUNK)
    assert landing.tmp.stat().st_size == size_before
    assert landing.tmp.read_bytes()[:16] == b"\x01" * 16


def test_write_behind_buffers_are_safe_to_drop_in_a_forked_child(tmp_path: Path) -> None:
    """A DataLoader worker forked after the parent used the pool maps new memory, then frees the
    buffers it inherited. With MADV_DONTFORK the buffers' ranges were holes in the child, a new
    mapping could land there, and freeing an inherited buffer unmapped it (SIGSEGV on the next
    touch). The child maps exactly into a buffer's range when it is a hole, to make that happen."""
    import ctypes
    import gc

    from cache import directio

    wb = directio.write_behind()
    path = tmp_path / "f.part"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        wb.submit(fd, fd, memoryview(b"x" * 8192), 0).result()
    finally:
        os.close(fd)
    # Collect in the parent: a collection in the child could finalise native objects that earlier
    # tests left behind (awscrt's) whose threads the child does not have; it crashed 1 run in ~10.
    gc.collect()
    pid = os.fork()
    if pid == 0:
        code = 1
        gc.disable()
        try:
            buf = wb._free.queue[0]
            view = ctypes.c_char.from_buffer(buf)
            addr = ctypes.addressof(view)
            del view
            libc = libc_with_mmap()
            # PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_FIXED_NOREPLACE: only into a hole
            got = libc.mmap(addr, directio.CHUNK, 3, 0x02 | 0x20 | 0x100000, -1, 0)
            del buf
            wb._free = None  # type: ignore[assignment]  # every inherited buffer is freed (munmap) here
            if got == addr:
                ctypes.memset(got, 0x79, directio.CHUNK)  # our own new mapping must still be there
            code = 0 if directio.write_behind() is not wb else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@given(st.binary(max_size=70_000), st.integers(min_value=0, max_value=2**32 - 1))
@settings(max_examples=200, deadline=None)
def test_the_fast_crc32_is_zlibs_crc32(data: bytes, start: int) -> None:
    """Downloads are verified against S3's CRC32 with ISA-L's implementation (zlib's where isal is
    missing): it must agree with zlib, running values included."""
    from cache.digests import crc32

    assert crc32(data, start) == zlib.crc32(data, start)
    assert crc32(memoryview(data)) == zlib.crc32(data)


def test_close_waits_for_a_write_in_progress(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A landing given up while a CRT callback is still inside write(): its descriptors must stay
    open until that write returns (a closed, reused fd number would take the bytes elsewhere)."""
    import threading

    from cache import directio
    from cache import landing as landing_mod

    landing = _piece_landing(tmp_path, 4 * directio.CHUNK)
    entered, release = threading.Event(), threading.Event()
    real = landing_mod.pwrite_all
    used: list[int] = []

    def slow(fd: int, data: memoryview, offset: int) -> None:
        entered.set()
        release.wait(60)  # until the test releases it (5 s could pass on a loaded runner before that)
        used.append(os.fstat(fd).st_ino)  # raises EBADF had the fd been closed under us
        real(fd, data, offset)

    monkeypatch.setattr(landing_mod, "pwrite_all", slow)
    writer = threading.Thread(target=landing.write, args=(memoryview(b"z" * 100), 1))  # unaligned: buffered
    writer.start()
    assert entered.wait(30)
    closer = threading.Thread(target=landing.keep_for_resume)
    closer.start()
    closer.join(0.3)
    assert closer.is_alive(), "the landing closed its descriptors under a write in progress"
    release.set()
    writer.join(30)
    closer.join(30)
    assert not closer.is_alive()
    assert used == [landing.tmp.stat().st_ino]
    assert landing.tmp.read_bytes()[1:101] == b"z" * 100


def test_buckets_with_dots_go_path_style_on_aws_as_botocore_does() -> None:
    from cache.s3 import target

    aws = "s3.us-east-1.amazonaws.com"
    assert target(aws, "", False, "plain-bucket", "a b/c") == (f"plain-bucket.{aws}", "/a%20b/c")
    # *.s3.us-east-1.amazonaws.com does not cover my.bucket.s3…: the certificate would not match
    assert target(aws, "", False, "my.bucket", "k") == (aws, "/my.bucket/k")
    assert target("minio:9000", "/base", True, "b", "k") == ("minio:9000", "/base/b/k")
