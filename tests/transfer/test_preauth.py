"""What a peer that never authenticates can cost the receiver: real TCP and QUIC on loopback.

Each test is a hostile or broken peer found by an independent review: a frame header and then
silence, a flood of idle connections, a process out of descriptors, a QUIC HELLO announcing a huge
body, and data poured into a QUIC stream the receiver already refused.
"""

from __future__ import annotations

import base64
import contextlib
import os
import resource
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from xfer_kit import TOKEN, Recv, make_tree, send, tree_digest, wait_for

from transfer import receiver as receiver_mod
from transfer.credentials import load_identity
from transfer.errors import PeerUnreachableError, ProtocolError
from transfer.frames import FrameType, control, header
from transfer.quic import QuicChannel, QuicConnection, QuicListener
from transfer.receiver import Receiver
from transfer.session import auth_mac
from transfer.tcp import TcpChannel, TcpListener, TcpTransport
from transfer.transport import Channel, ConnectOptions, Identity, ListenOptions

pytestmark = pytest.mark.integration

NO_TLS = Identity(b"", b"", "")


@contextlib.contextmanager
def tcp_receiver(dest: Path, **extra: int) -> Iterator[TcpListener]:
    rc = Receiver(dest, TOKEN.encode())
    lst = TcpTransport().listen(
        ListenOptions("127.0.0.1", 0, NO_TLS, tls=False, extra=dict(extra)), rc.handle_channel
    )
    thread = threading.Thread(target=lst.serve_forever, daemon=True)
    thread.start()
    try:
        yield lst
    finally:
        lst.close()
        thread.join(timeout=5)
        rc.close()


def _closed_by_peer(sock: socket.socket, wait: float = 10.0) -> bool:
    """True when the other end closed (EOF or reset) within `wait` seconds."""
    sock.settimeout(wait)
    try:
        return sock.recv(100) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def _hello(ch: TcpChannel, role: str = "control", tid: str = "t" * 32) -> bytes:
    nonce = os.urandom(16)
    body = {"role": role, "transfer_id": tid, "nonce": base64.b64encode(nonce).decode(), "auth": 2}
    ch.send(control(FrameType.HELLO, body))
    frame = ch.recv(10)
    assert frame is not None and frame.type is FrameType.CHALLENGE
    ch.send(
        control(
            FrameType.AUTH,
            {"mac": auth_mac(TOKEN.encode(), base64.b64decode(frame.json()["nonce"]), nonce, role, tid)},
        )
    )
    return nonce


# -- TCP -----------------------------------------------------------------------------------------


def test_tcp_recv_timeout_covers_the_frame_body() -> None:
    """A header and then silence: recv(timeout) must time out, not wait for the body for ever."""
    with socket.create_server(("127.0.0.1", 0)) as srv:
        peer = socket.create_connection(srv.getsockname()[:2])
        conn, _ = srv.accept()
        with peer, conn:
            peer.sendall(header(FrameType.HELLO, 100) + b"x" * 10)
            ch = TcpChannel(conn, 1 << 20)
            with pytest.raises(TimeoutError):
                ch.recv(timeout=0.5)


@pytest.mark.parametrize("authenticated", [True, False])
def test_tcp_slow_but_moving_frame_is_cut_only_before_auth(authenticated: bool) -> None:
    """After AUTH the timeout bounds silence, not the frame: a chunk trickling over a slow link
    (here a piece every 0.05 s, its last only once twice recv's 1 s timeout has passed) must arrive
    whole. Before AUTH the whole frame is bounded (found by a review: a 64 MiB chunk at 200 KiB/s
    was cut at 300 s, and its resend the same way, for ever). The frame always outlasts the
    timeout (the last piece waits for the clock), and a stall of the sending thread of up to
    0.95 s still leaves the link moving by recv's measure."""
    timeout = 1.0
    body = os.urandom(200_000)
    with socket.create_server(("127.0.0.1", 0)) as srv:
        peer = socket.create_connection(srv.getsockname()[:2])
        conn, _ = srv.accept()

        def trickle() -> None:
            data = memoryview(header(FrameType.HELLO, len(body)) + body)
            ends = time.monotonic() + 2 * timeout
            piece = 2_000  # 106 pieces at 0.05 s: ~5 s of room, cut short by the clock below
            with contextlib.suppress(OSError):
                while len(data) > piece and time.monotonic() < ends:
                    peer.sendall(data[:piece])
                    data = data[piece:]
                    time.sleep(0.05)
                while time.monotonic() < ends:  # (not reached: the pieces outlast the clock)
                    time.sleep(0.05)
                peer.sendall(data)

        sender = threading.Thread(target=trickle)
        with peer, conn:
            ch = TcpChannel(conn, 1 << 20, frame_limit=None if authenticated else 1 << 20)
            sender.start()
            try:
                if authenticated:
                    frame = ch.recv(timeout=timeout)
                    assert frame is not None and bytes(frame.body) == body
                else:
                    with pytest.raises(TimeoutError):
                        ch.recv(timeout=timeout)
            finally:
                sender.join()


def test_tcp_peer_that_stalls_inside_a_frame_is_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(receiver_mod, "PRE_AUTH_TIMEOUT", 1.0)
    with tcp_receiver(tmp_path / "dst") as lst:
        silent = socket.create_connection(lst.address)
        stalled = socket.create_connection(lst.address)
        with silent, stalled:
            stalled.sendall(header(FrameType.HELLO, 100))  # a header, then nothing
            assert _closed_by_peer(silent)
            assert _closed_by_peer(stalled)


def _assert_served(address: tuple[str, int]) -> None:
    """A new connection to `address` is served: its HELLO gets a CHALLENGE (else _hello fails)."""
    ch = TcpChannel(socket.create_connection(address, timeout=10), 1 << 20)
    try:
        _hello(ch)
    finally:
        ch.close()


def test_tcp_unauthenticated_connections_are_capped(tmp_path: Path) -> None:
    """Past the cap a new connection is closed at once; one that authenticated frees its slot; the
    listener stays up throughout."""
    with tcp_receiver(tmp_path / "dst", max_unauthenticated=3) as lst:
        idle = [TcpChannel(socket.create_connection(lst.address, timeout=10), 1 << 20) for _ in range(3)]
        try:
            extra = socket.create_connection(lst.address)
            with extra:
                assert _closed_by_peer(extra)
            _hello(idle[0])  # authenticates: no longer counts
            # its AUTH is handled in the receiver's thread: wait until the slot is free
            assert wait_for(lambda: lst._slots.held() < 3, 10)
            _assert_served(lst.address)
        finally:
            for ch in idle:
                ch.close()


def test_tcp_one_address_cannot_take_every_slot(tmp_path: Path) -> None:
    """A host that opens connections and says nothing fills only its own share of the slots: its
    next connection is closed at once, while a sender from another address is still served."""
    with tcp_receiver(tmp_path / "dst", max_unauthenticated=8, max_unauthenticated_per_peer=2) as lst:
        idle = [
            socket.create_connection(lst.address, timeout=10, source_address=("127.0.0.2", 0))
            for _ in range(2)
        ]
        try:
            assert wait_for(lambda: lst._slots.held("127.0.0.2") == 2, 10)
            extra = socket.create_connection(lst.address, source_address=("127.0.0.2", 0))
            with extra:
                assert _closed_by_peer(extra)
            _assert_served(lst.address)  # from 127.0.0.1
        finally:
            for s in idle:
                s.close()


def _few_fds(pid: int) -> None:
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (64, 64))


def test_recv_out_of_descriptors_keeps_serving(tmp_path: Path) -> None:
    """EMFILE in accept() once killed the listener thread and `rq recv` exited 0; now it waits for
    descriptors to come back and the next transfer goes through."""
    ckpt = make_tree(tmp_path / "src", random_bytes=200_000, bf16_elems=50_000)
    recv = Recv(tmp_path / "dst", tmp_path / "cert", "tcp").start()
    assert recv.proc is not None
    socks: list[socket.socket] = []
    try:
        _few_fds(recv.proc.pid)
        for _ in range(90):  # more than the 64 descriptors; the rest wait in the listen backlog
            socks.append(socket.create_connection(("127.0.0.1", recv.port), timeout=5))
        assert not wait_for(lambda: recv.proc is not None and recv.proc.poll() is not None, 2)
        for s in socks:
            s.close()
        proc = send([ckpt], recv, "--retry-for", "20")
        assert proc.returncode == 0, proc.stderr.decode()
        assert recv.proc.poll() is None
    finally:
        for s in socks:
            s.close()
        rc, _, err = recv.stop()
    assert rc == 0, err  # stopped by SIGTERM, not before
    assert "Traceback" not in err, err
    assert tree_digest(tmp_path / "dst" / "ckpt") == tree_digest(ckpt)


def test_recv_exits_nonzero_when_its_listener_dies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A listener that cannot go on (here: its accept loop raises) must not look like success."""
    from click.testing import CliRunner

    from rqcli.errors import CliError
    from rqcli.exitcodes import ExitCode
    from rqcli.main import cli
    from transfer.errors import TransferError

    def broken(_self: TcpListener) -> None:
        raise TransferError("cannot accept connections on 127.0.0.1:1: Invalid argument")

    monkeypatch.setattr(TcpListener, "serve_forever", broken)
    monkeypatch.setenv("RQ_TOKEN", TOKEN)
    args = ["recv", str(tmp_path / "dst"), "--listen", "127.0.0.1:0", "--transport", "tcp"]
    result = CliRunner().invoke(cli, [*args, "--cert-dir", str(tmp_path / "cert")])
    # rqcli.main.main turns the CliError into its one line and exit code
    assert isinstance(result.exception, CliError), result.output
    assert result.exception.code is ExitCode.FAILURE
    assert "the listener stopped: cannot accept connections" in result.exception.message


# -- QUIC ----------------------------------------------------------------------------------------


@contextlib.contextmanager
def quic_pair(
    tmp_path: Path, handler: object, **listen: int
) -> Iterator[tuple[QuicListener, QuicConnection]]:
    """A real QUIC listener (aioquic) on loopback with `handler`, and our client connected to it."""
    ident = load_identity(tmp_path / "cert")
    extra = {"quic_backend": "aioquic"}
    lst = QuicListener(ListenOptions("127.0.0.1", 0, ident, extra={**extra, **listen}), handler)  # type: ignore[arg-type]
    try:
        host, port = lst.address
        conn = QuicConnection(ConnectOptions(host, port, ident.fingerprint, extra=extra))
        try:
            yield lst, conn
        finally:
            conn.close()
    finally:
        lst.close()


def test_quic_stream_has_the_pre_auth_limit_before_its_handler_runs(tmp_path: Path) -> None:
    """The loop decodes a stream's first bytes before the handler thread has run: a HELLO header
    announcing 60 MiB must be refused there, not answered with a 60 MiB buffer."""
    got: list[QuicChannel] = []
    hold = threading.Event()

    def slow_handler(ch: Channel) -> None:  # a handler that has not got round to anything yet
        assert isinstance(ch, QuicChannel)
        got.append(ch)
        hold.wait(10)

    with quic_pair(tmp_path, slow_handler) as (_, conn):
        ch = conn.open_channel()
        ch.send(header(FrameType.HELLO, 60 << 20), b"x" * 1000)
        assert wait_for(lambda: bool(got), 10)
        with pytest.raises(ProtocolError, match="over the"):
            got[0].recv(timeout=10)
        assert got[0].decoder.pending == 0
        hold.set()


def test_quic_refused_stream_stops_taking_data(tmp_path: Path) -> None:
    """After the receiver refused a stream, what the peer still pours into it is dropped (and the
    peer told to stop), not queued for a handler that is gone."""
    rc = Receiver(tmp_path / "dst", TOKEN.encode())
    served: list[QuicChannel] = []

    def handler(ch: Channel) -> None:
        assert isinstance(ch, QuicChannel)
        served.append(ch)
        rc.handle_channel(ch)

    try:
        with quic_pair(tmp_path, handler) as (_, conn):
            ch = conn.open_channel()
            ch.send(control(FrameType.CHALLENGE, {}))  # not a HELLO: refused
            frame = ch.recv(timeout=10)
            assert frame is not None and frame.type is FrameType.ERROR
            small = header(FrameType.HELLO, 1000) + b"y" * 1000
            # STOP_SENDING resets our side of the stream. Bounded by time, not by a count: under
            # load 2,000 sends (32 MB) could all be taken before the receiver's STOP_SENDING arrived
            deadline = time.monotonic() + 30
            with pytest.raises(PeerUnreachableError):
                while time.monotonic() < deadline:
                    ch.send(small * 16)
            assert served and served[0].frames.qsize() == 0
    finally:
        rc.close()


def test_quic_manifest_pipelined_behind_auth_is_not_refused(tmp_path: Path) -> None:
    """The sender sends MANIFEST right behind AUTH; one over the 64 KiB pre-auth limit (a few
    hundred files) was refused over QUIC when the loop decoded its header before the handler
    had checked AUTH."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(300):
        (src / f"{i:04d}-{'n' * 200}").write_bytes(b"%d" % i)
    recv = Recv(tmp_path / "dst", tmp_path / "cert", "quic", "--once").start()
    try:
        proc = send([src], recv)
        assert proc.returncode == 0, proc.stderr.decode()
    finally:
        recv.stop()
    assert tree_digest(tmp_path / "dst" / "src") == tree_digest(src)


def test_quic_library_errors_do_not_print_tracebacks(tmp_path: Path) -> None:
    """qh3 (receiver) raises "packet builder capacity exhausted" out of transmit() while it shakes
    hands with an aioquic peer; asyncio printed each as a traceback on recv's stderr (~60 per
    connection, slow enough to fail a third of the handshakes). They go to the debug log now."""
    recv = Recv(tmp_path / "dst", tmp_path / "cert", "quic", "--quic-backend", "qh3").start()
    try:
        for _ in range(3):
            opts = ConnectOptions("127.0.0.1", recv.port, recv.pin, extra={"quic_backend": "aioquic"})
            conn = QuicConnection(opts)
            try:
                ch = conn.open_channel()
                ch.send(header(FrameType.HELLO, 60 << 20))
                frame = ch.recv(timeout=10)
                assert frame is not None and frame.type is FrameType.ERROR
            finally:
                conn.close()
        ckpt = make_tree(tmp_path / "src", random_bytes=100_000, bf16_elems=10_000)
        proc = send([ckpt], recv)
        assert proc.returncode == 0, proc.stderr.decode()
    finally:
        _, _, err = recv.stop()
    assert err.count("refused a transfer") == 3, err
    assert "Traceback" not in err, err


def test_quic_streams_from_one_address_are_capped(tmp_path: Path) -> None:
    """Past its address's share of the unauthenticated slots a new stream is turned away (reset),
    not given a handler thread; the streams already served keep theirs."""
    served: list[QuicChannel] = []
    hold = threading.Event()

    def handler(ch: Channel) -> None:
        assert isinstance(ch, QuicChannel)
        served.append(ch)
        hold.wait(10)

    with quic_pair(tmp_path, handler, max_unauthenticated=8, max_unauthenticated_per_peer=2) as (lst, conn):
        try:
            for _ in range(2):  # a stream id is taken by its first bytes: open one at a time
                conn.open_channel().send(header(FrameType.HELLO, 10))
            assert wait_for(lambda: len(served) == 2, 10)
            third = conn.open_channel()
            third.send(header(FrameType.HELLO, 10))
            with pytest.raises(PeerUnreachableError, match="reset"):
                third.recv(timeout=10)
            assert len(served) == 2 and lst._slots.held("127.0.0.1") == 2
        finally:
            hold.set()
