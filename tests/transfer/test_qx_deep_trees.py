"""Directory trees deeper than PATH_MAX.

- A SOURCE whose directories lie past PATH_MAX (4096 bytes of absolute path) while their names
  under SOURCE fit the protocol's 4096 bytes is sent whole. Before, listing such a directory failed
  (`cannot list …: File name too long`, exit 3). The receiver writes them under a DEST_DIR whose
  own path is long too (it opens component by component from DEST_DIR's descriptor).
- A name under SOURCE longer than the protocol carries (names.MAX_NAME_BYTES) is refused before
  anything is sent, one line naming it, exit 1. Before, it was skipped with a warning and `rq send`
  exited 0: the tree arrived incomplete."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from rqtest import serving_receiver
from xfer_kit import REPO, free_port, rq_cmd, rq_env

from transfer.receiver import Receiver
from transfer.sender import SendOptions, send
from transfer.tcp import TcpTransport
from transfer.transport import ConnectOptions

TOKEN = b"qx-deep-trees-token-" + b"x" * 12
CS = 64 * 1024
PATH_MAX = os.pathconf("/", "PC_PATH_MAX")


def _fd_of(root: Path, comps: list[str]) -> int:
    """A descriptor of root/comps…, made as needed, however long the path."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for c in comps:
        if not c:
            continue
        try:
            os.mkdir(c, dir_fd=fd)
        except FileExistsError:
            pass
        nfd = os.open(c, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = nfd
    return fd


def _write(root: Path, comps: list[str], name: str, data: bytes) -> None:
    fd = _fd_of(root, comps)
    try:
        f = os.open(name, os.O_WRONLY | os.O_CREAT, 0o640, dir_fd=fd)
        os.write(f, data)
        os.close(f)
    finally:
        os.close(fd)


def _read(root: Path, comps: list[str], name: str) -> bytes:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for c in comps:
            nfd = os.open(c, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nfd
        f = os.open(name, os.O_RDONLY, dir_fd=fd)
        try:
            return os.read(f, 1 << 20)
        finally:
            os.close(f)
    finally:
        os.close(fd)


def test_a_tree_past_path_max_is_sent_whole(tmp_path: Path) -> None:
    # SOURCE itself ~2500 bytes deep; under it directories taking the paths past 2 × PATH_MAX, their
    # names under SOURCE ~3000 bytes (under the protocol's 4096)
    outer = ["o" * 250] * 10
    inner = ["i" * 250] * 12
    data = os.urandom(2 * CS + 5)
    _write(tmp_path, [*outer, "src", *inner], "deep.bin", data)
    _write(tmp_path, [*outer, "src", *inner[:7]], "mid.txt", b"mid")
    os.close(_fd_of(tmp_path, [*outer, "src", *inner, "empty"]))
    src = tmp_path.joinpath(*outer, "src")
    assert len(os.fsencode(src)) < PATH_MAX < len(os.fsencode(src.joinpath(*inner)))
    dest_comps = ["d" * 250] * 6  # DEST_DIR ~1500 bytes: what arrives is past PATH_MAX there too
    os.close(_fd_of(tmp_path, dest_comps))
    dest = tmp_path.joinpath(*dest_comps)
    rx = Receiver(dest, TOKEN)
    with serving_receiver(rx, TcpTransport(), tmp_path / "cert", tls=False) as (listener, _):
        opts = SendOptions(streams=1, chunk_size=CS, compress="none", retry_for=5.0)
        to = ConnectOptions("127.0.0.1", listener.address[1], None, tls=False)
        summary = send([src], TcpTransport(), to, TOKEN, opts)
    assert summary["complete"] is True
    assert not summary.get("skipped")
    assert _read(dest, ["src", *inner], "deep.bin") == data
    assert _read(dest, ["src", *inner[:7]], "mid.txt") == b"mid"
    os.close(_fd_of(dest, ["src", *inner, "empty"]))  # the empty directory came as well


def test_a_name_over_the_protocol_limit_is_refused_before_sending(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "fine.txt").write_bytes(b"fine")
    _write(src, ["a" * 250] * 17, "f.txt", b"far")  # name under src: ~4270 bytes
    port = free_port()  # nothing listens: the scan refuses first
    proc = subprocess.run(
        rq_cmd("send", str(src), f"rq://127.0.0.1:{port}", "--transport", "tcp", "--retry-for", "0"),
        env=rq_env(),
        capture_output=True,
        timeout=60,
        cwd=REPO,
        check=False,
    )
    err = proc.stderr.decode()
    assert proc.returncode == 1, (proc.returncode, err)
    assert "cannot send" in err and "over the 4096 the protocol carries; nothing was sent" in err, err
    assert str(tmp_path) in err
