"""`rq recv` binds its --listen address before it creates DEST: a port that cannot be had leaves no
empty DEST (nor DEST/.rq-partial) behind."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest
from xfer_kit import REPO, rq_cmd, rq_env


def _recv(tmp_path: Path, dest: Path, listen: str, transport: str) -> subprocess.CompletedProcess[bytes]:
    args = [
        "recv",
        str(dest),
        "--listen",
        listen,
        "--transport",
        transport,
        "--cert-dir",
        str(tmp_path / "c"),
    ]
    return subprocess.run(rq_cmd(*args), env=rq_env(), capture_output=True, timeout=60, cwd=REPO, check=False)


@pytest.mark.parametrize("transport", ["tcp", "quic"])
def test_a_port_in_use_leaves_no_dest_behind(tmp_path: Path, transport: str) -> None:
    kind = socket.SOCK_STREAM if transport == "tcp" else socket.SOCK_DGRAM
    with socket.socket(socket.AF_INET, kind) as taken:
        taken.bind(("127.0.0.1", 0))
        if kind == socket.SOCK_STREAM:
            taken.listen()
        port = taken.getsockname()[1]
        proc = _recv(tmp_path, tmp_path / "new" / "dest", f"127.0.0.1:{port}", transport)
    assert proc.returncode == 2, proc.stderr.decode()
    assert f"cannot listen on 127.0.0.1:{port}" in proc.stderr.decode()
    assert not (tmp_path / "new").exists()


def test_a_bad_dest_after_the_bind_is_still_its_own_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    proc = _recv(tmp_path, tmp_path / "file" / "dest", "127.0.0.1:0", "tcp")
    assert proc.returncode == 2, proc.stderr.decode()
    assert "cannot use" in proc.stderr.decode()
