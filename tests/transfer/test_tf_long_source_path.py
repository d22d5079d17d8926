"""A file under a directory SOURCE whose absolute path is longer than PATH_MAX (its directory's is
not) is sent like any other. Before, os.stat of the whole path failed (ENAMETOOLONG): the file was
skipped with a warning ('cannot stat: File name too long') and `rq send` exited 0 without it. The
sender now stats and opens such a file relative to its directory's descriptor."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from transfer.receiver import Receiver
from transfer.sender import SendOptions, send
from transfer.source import Reader, Skipped, check_unchanged, scan
from transfer.tcp import TcpTransport
from transfer.transport import ConnectOptions, Identity, ListenOptions

TOKEN = b"tf-long-path-token-" + b"x" * 13
CS = 64 * 1024
PATH_MAX = os.pathconf("/", "PC_PATH_MAX")


def _long_tree(tmp_path: Path) -> tuple[Path, Path, bytes]:
    """SOURCE `src` with a directory just under PATH_MAX deep in it and, there, a file whose path
    is over PATH_MAX (its name relative to SOURCE stays under the protocol's 4096 bytes)."""
    src = tmp_path / "src"
    deep = src
    while len(os.fsencode(deep)) < PATH_MAX - 150:
        deep = deep / ("d" * min(200, PATH_MAX - 150 - len(os.fsencode(deep))))
    os.makedirs(deep)
    (src / "short.bin").write_bytes(b"s" * 100)
    name = "f" * (PATH_MAX + 10 - len(os.fsencode(deep)) - 1)  # the whole path: PATH_MAX + 10 bytes
    data = os.urandom(2 * CS + 17)
    dfd = os.open(deep, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT, 0o640, dir_fd=dfd)
        os.write(fd, data)
        os.close(fd)
    finally:
        os.close(dfd)
    long_path = deep / name
    assert len(os.fsencode(long_path)) >= PATH_MAX
    return src, long_path, data


def test_scan_and_read_a_path_over_path_max(tmp_path: Path) -> None:
    src, long_path, data = _long_tree(tmp_path)
    skipped: list[Skipped] = []
    manifest, files = scan([src], CS, skipped)
    assert skipped == []
    assert [sf.path for sf in files if sf.path == long_path] == [long_path]
    i = next(n for n, sf in enumerate(files) if sf.path == long_path)
    assert manifest.files[i].size == len(data)
    reader = Reader(files, CS)
    try:
        got = b"".join(bytes(reader.read(i, k, min(CS, len(data) - k * CS))) for k in range(3))
    finally:
        reader.close()
    assert got == data
    check_unchanged(files)  # stat'able again after the send


def test_send_delivers_a_path_over_path_max(tmp_path: Path) -> None:
    src, long_path, data = _long_tree(tmp_path)
    dest = tmp_path / "dst"
    receiver = Receiver(dest, TOKEN)
    listener = TcpTransport().listen(
        ListenOptions("127.0.0.1", 0, Identity(b"", b"", ""), tls=False), receiver.handle_channel
    )
    threading.Thread(target=listener.serve_forever, daemon=True).start()
    try:
        summary = send(
            [src],
            TcpTransport(),
            ConnectOptions("127.0.0.1", listener.address[1], None, tls=False),
            TOKEN,
            SendOptions(streams=1, chunk_size=CS, compress="none", retry_for=5.0),
        )
    finally:
        listener.close()
        receiver.close()
    assert summary["complete"] is True
    assert not summary.get("skipped")
    rel = long_path.relative_to(tmp_path)
    dfd = os.open(dest / rel.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd = os.open(rel.name, os.O_RDONLY, dir_fd=dfd)
        try:
            assert os.read(fd, len(data) + 1) == data
        finally:
            os.close(fd)
    finally:
        os.close(dfd)
