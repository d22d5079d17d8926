"""`rq send` to a receiver on the other transport (QUIC is UDP, TCP is TCP) cannot tell it from no
receiver at all: the failure stays exit 6, and its one line now says to check --transport."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from rqtest import popen_rq_with
from xfer_kit import rq_env

from rqcli.exitcodes import ExitCode

# the first-connect grace (10 s in production) lowered: the test waits out no production interval
SHORT_GRACE = "import transfer.sender\ntransfer.sender.FIRST_CONNECT_GRACE = 0.3"


@pytest.mark.parametrize(("transport", "listens"), [("quic", socket.SOCK_STREAM), ("tcp", socket.SOCK_DGRAM)])
def test_a_send_over_the_other_transport_says_check_transport(
    tmp_path: Path, transport: str, listens: int
) -> None:
    """Something listens at the port, over the other protocol only (as `rq recv --transport X`
    does): the hint asked only whether `rq recv` ran at that address and port."""
    src = tmp_path / "f"
    src.write_bytes(b"x" * 1000)
    with socket.socket(socket.AF_INET, listens) as other:
        other.bind(("127.0.0.1", 0))
        if listens == socket.SOCK_STREAM:
            other.listen()
        port = other.getsockname()[1]
        args = ["send", str(src), f"rq://127.0.0.1:{port}", "--transport", transport, "--json"]
        if transport == "quic":
            args += ["--pin", "sha256:" + "ab" * 32]
        proc = popen_rq_with(SHORT_GRACE, *args, env=rq_env())
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == ExitCode.UNREACHABLE, err
    last = err.decode().strip().splitlines()[-1]
    assert last.startswith("rq: error: ") and f"with --transport {transport}" in last, last
    assert f"with --transport {transport}" in json.loads(out.decode().splitlines()[-1])["error"]
