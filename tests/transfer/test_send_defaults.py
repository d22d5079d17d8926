"""Per-transport defaults of `rq send` (the reasons and figures are in docs/transfer.md), and the
flags' ranges: bad values are usage errors (exit 2, one line), never tracebacks or exit 1/4."""

from __future__ import annotations

from pathlib import Path

import pytest
from rqtest import run_rq

from rqcli.commands.transfer import default_streams
from transfer.credentials import load_identity
from transfer.quic import AIOQUIC_MAX_DATAGRAM, QuicListener
from transfer.transport import ListenOptions


def test_tcp_defaults_to_one_connection_quic_to_two_streams() -> None:
    assert default_streams("tcp") == 1
    assert default_streams("quic") == 2
    assert default_streams("rdma") == 2


URL = "rq://127.0.0.1:9"


@pytest.mark.parametrize(
    "args,says",
    [
        (("send", "SRC", URL, "--datagram-size", "-5"), "--datagram-size"),  # was OverflowError, exit 1
        (("send", "SRC", URL, "--datagram-size", "10"), "--datagram-size"),  # was ValueError, exit 1
        (("recv", "DST", "--datagram-size", "-5"), "--datagram-size"),  # was accepted
        (("send", "SRC", URL, "--pin", "sha256:abc"), "64 hex digits"),  # was exit 4, the token hint
        (("recv", "DST", "--max-files", "-1"), "--max-files"),  # was accepted
        (("recv", "DST", "--max-bytes", "0"), "--max-bytes"),
        (("send", "SRC", URL, "--retry-for", "-1"), "--retry-for"),
        (("send", "SRC", "OTHER", URL), "would both arrive as 'x'"),  # was exit 1
    ],
)
def test_bad_flag_values_are_usage_errors(tmp_path: Path, args: tuple[str, ...], says: str) -> None:
    (tmp_path / "a" / "x").mkdir(parents=True)
    (tmp_path / "b" / "x").mkdir(parents=True)
    subst = {"SRC": str(tmp_path / "a" / "x"), "OTHER": str(tmp_path / "b" / "x"), "DST": str(tmp_path / "d")}
    proc = run_rq(*(subst.get(a, a) for a in args), env={"RQ_TOKEN": "t"}, timeout=30)
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert says in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "d").exists()  # recv never started


def test_aioquic_datagrams_are_clamped_to_what_it_encodes(tmp_path: Path) -> None:
    """--datagram-size takes up to 65000 (qh3); aioquic's 2-byte length fields corrupt anything
    over 16383, so the driver clamps it there."""
    ident = load_identity(tmp_path / "cert")
    extra = {"quic_backend": "aioquic", "datagram_size": 65000}
    lst = QuicListener(ListenOptions("127.0.0.1", 0, ident, extra=extra), lambda ch: None)
    try:
        assert lst.datagram == AIOQUIC_MAX_DATAGRAM == 16383
    finally:
        lst.close()


def test_a_symlink_loop_as_source_is_not_found(tmp_path: Path) -> None:
    (tmp_path / "loop").symlink_to("loop")
    r = run_rq("send", "loop", "rq://127.0.0.1:9", "--transport", "tcp", cwd=tmp_path, env={"RQ_TOKEN": "t"})
    assert r.returncode == 3 and r.stderr.decode().strip() == "rq: error: source not found: loop", r.stderr
