"""The RDMA transport: a TCP+TLS bootstrap channel that upgrades to a queue pair once authenticated.

Each channel starts as an ordinary TCP channel with TLS and the receiver's pinned certificate
(transfer.tcp). The transfer core runs HELLO → CHALLENGE → AUTH over it exactly as on TCP, so the
token is checked before any RDMA resource exists. The first ACCEPT or READY the receiver sends is
the switch: right after it, on the same TLS connection,

    receiver → sender   I + connection info (QP number, PSN, LID, GID, MTU, ring address, rkey, slots)
    sender   → receiver I + its connection info          (or E + reason, either way, and both close)
    receiver → sender   G                                  (both queue pairs are ready to send)

and from then on every frame of the channel moves over the reliable-connected queue pair
(pipe.Pipe). The TLS connection stays open as the liveness line: B (goodbye) after a side's last
write completed, or EOF if a side died. RDMA itself is not encrypted: see docs/rdma.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import select
import ssl
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from transfer.errors import AuthError, PeerUnreachableError, ProtocolError, TransferError
from transfer.frames import HEADER, Frame, FrameType
from transfer.rdma import conninfo
from transfer.rdma.errors import RdmaDeviceError
from transfer.rdma.pipe import Interrupted, PeerClosed, Pipe, post_receives, recv_depth
from transfer.transport import Channel, ConnectOptions, ListenOptions

UPGRADE_AT = (FrameType.ACCEPT, FrameType.READY)
MSG = struct.Struct("!cI")
MAX_MSG = 4096
SETUP_TIMEOUT = 15.0
DRAIN_TIMEOUT = 10.0


@dataclass(frozen=True)
class Geometry:
    """How much memory a side registers: the ring the peer writes into and our staging buffers."""

    ring_slots: int
    slot_size: int
    staging: int
    staging_size: int


# The receiver takes bulk data: a deep ring of 1 MiB slots. The sender only gets ACKs back.
RECEIVER = Geometry(ring_slots=32, slot_size=1 << 20, staging=8, staging_size=64 << 10)
SENDER = Geometry(ring_slots=16, slot_size=64 << 10, staging=32, staging_size=1 << 20)


@dataclass(frozen=True)
class RdmaSettings:
    device: str | None = None
    port: int = 1
    gid_index: int | None = None
    receiver: Geometry = RECEIVER
    sender: Geometry = SENDER

    @classmethod
    def from_extra(cls, extra: dict[str, Any]) -> RdmaSettings:
        gid = extra.get("gid_index", extra.get("rdma_gid_index"))
        return cls(
            device=extra.get("rdma_device") or None,
            port=int(extra.get("rdma_port") or 1),
            gid_index=None if gid is None else int(gid),
        )


def setup_timeout() -> float:
    return SETUP_TIMEOUT  # a function so tests can shorten it


def frame_boundary_after_upgrade(data: bytes) -> int | None:
    """Offset just past the first ACCEPT/READY frame in `data` (whole frames), or None."""
    pos = 0
    while pos + HEADER.size <= len(data):
        _, _, ftype, length = HEADER.unpack_from(data, pos)
        pos += HEADER.size + length
        if ftype in UPGRADE_AT:
            return min(pos, len(data))
    return None


class RdmaChannel:
    """A frame channel that starts on TCP/TLS and moves to a queue pair after authentication."""

    def __init__(self, tcp: Any, acceptor: bool, settings: RdmaSettings, max_frame: int):
        self.tcp = tcp
        self.acceptor = acceptor
        self.settings = settings
        self.max_frame = max_frame
        self.qp: Any = None
        self.pipe: Pipe | None = None
        self._switch = threading.Lock()
        self._last_check = 0.0
        self._live = bytearray()  # bytes of a goodbye read so far, after the switch
        self._closed = False
        # when this side's listener, closing, shut the bootstrap's read side under the pipe (see
        # _liveness); None until then
        self._cut_at: float | None = None

    # -- the Channel protocol ----------------------------------------------------------------------

    def send(self, *parts: bytes | bytearray | memoryview) -> None:
        if self.pipe is not None:
            self.pipe.send(parts)
            return
        if not self.acceptor:
            self.tcp.send(*parts)
            return
        data = b"".join(parts)  # before the switch only small control frames pass here
        cut = frame_boundary_after_upgrade(data)
        if cut is None:
            self.tcp.send(data)
            return
        self.tcp.send(data[:cut])
        self._upgrade()
        if cut < len(data):
            assert self.pipe is not None
            self.pipe.send((data[cut:],))

    def recv(self, timeout: float | None = None) -> Frame | None:
        if self.pipe is None:
            frame = self.tcp.recv(timeout)
            if frame is None or self.acceptor or frame.type not in UPGRADE_AT:
                return frame
            frame = Frame(frame.type, memoryview(bytes(frame.body)))  # the TCP buffer is reused
            self._upgrade()
            return frame
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            return self.pipe.recv(deadline)
        except PeerClosed:
            return self.pipe.take_ready()
        except PeerUnreachableError:
            frame = self.pipe.take_ready()
            if frame is not None:
                return frame
            raise

    # -- capabilities the receiver looks for (docs/transfer.md) -------------------------------------

    @property
    def frame_limit(self) -> int | None:
        """The cap on the next frames' size. Every frame up to the switch (AUTH, the MANIFEST)
        travels on the TCP bootstrap channel, so the cap is that channel's; the listener's
        unauthenticated slot is that channel's too, and lifting the cap (None) gives it back."""
        return self.tcp.frame_limit

    @frame_limit.setter
    def frame_limit(self, value: int | None) -> None:
        self.tcp.frame_limit = value

    def release_slot(self) -> None:
        """This connection stops counting as unauthenticated (idempotent)."""
        self.tcp.release_slot()

    @property
    def shutting_down(self) -> bool:
        """Set by the listener's close() before it ends the channel (on the TCP bootstrap channel
        it tracks): the receiver then tells an authenticated sender that it shut down, as over TCP
        and QUIC. Before, an RDMA channel had none: its sender was told nothing."""
        return bool(getattr(self.tcp, "shutting_down", False))

    def readable(self) -> bool:
        """A frame is waiting: recv would not block (receiver._Readiness: a batch of small chunks is
        made durable and ACKed when this turns False). After the switch, the pipe's frames and the
        completions already polled-for; before it, the bootstrap connection's bytes."""
        pipe = self.pipe
        if pipe is not None:
            return pipe.ready()
        sock = self.tcp.sock
        if isinstance(sock, ssl.SSLSocket) and sock.pending() > 0:
            return True
        try:
            return bool(select.select([sock], [], [], 0)[0])
        except (OSError, ValueError):
            return True  # closed: recv answers at once

    def progress(self) -> int:
        """A count that grows as the bytes sent reach the peer (sender's stall watch, see
        TcpChannel.progress): the bootstrap channel's, plus the bytes of the RDMA writes that
        completed (the peer's adapter has them in its ring). It stands still when the peer stops
        giving slots back, since no write can then be posted."""
        done = self.pipe.bytes_done if self.pipe is not None else 0
        return int(self.tcp.progress()) + done

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if (
            self.pipe is not None
            and self.pipe.broken is None
            and self.pipe.drain(time.monotonic() + DRAIN_TIMEOUT)
        ):
            with contextlib.suppress(OSError, ssl.SSLError, TransferError):
                self._send_msg(b"B")
        if self.pipe is not None:
            self.pipe.shut(PeerUnreachableError("the channel was closed"), self.qp.close)
        elif self.qp is not None:
            self.qp.close()
        self.tcp.close()

    # -- the switch --------------------------------------------------------------------------------

    def _upgrade(self) -> None:
        from transfer.rdma import verbs

        with self._switch:
            if self.pipe is not None:
                return
            s = self.settings
            mine = s.receiver if self.acceptor else s.sender
            try:
                self.tcp.sock.settimeout(setup_timeout())
                if not self.acceptor:
                    peer = self._first_info()  # the receiver speaks first
                dev = verbs.open_device(s.device, s.port, s.gid_index)
                depth = recv_depth(mine.ring_slots, mine.staging)
                self.qp = verbs.QueuePair(
                    dev, mine.ring_slots, mine.slot_size, mine.staging, mine.staging_size, depth
                )
                post_receives(self.qp, depth)
                local = self.qp.local_info()
                if self.acceptor:
                    self._send_msg(b"I", local.encode())
                    peer = self._expect_info()
                    mtu = conninfo.check_compatible(local, peer)
                    self.qp.connect(peer, mtu)
                    self._send_msg(b"G")
                else:
                    mtu = conninfo.check_compatible(local, peer)
                    self.qp.connect(peer, mtu)
                    self._send_msg(b"I", local.encode())
                    tag, _ = self._read_msg()
                    if tag != b"G":
                        raise ProtocolError(f"expected the receiver's go-ahead, got {tag!r}")
                self.tcp.sock.settimeout(None)
            except TransferError as exc:
                self._abort(exc)
                raise
            except (OSError, ssl.SSLError) as exc:
                err = PeerUnreachableError(f"connection lost while setting up RDMA: {exc}")
                self._abort(err)
                raise err from None
            self.pipe = Pipe(
                self.qp,
                local_slots=mine.ring_slots,
                local_slot_size=mine.slot_size,
                peer_slots=peer.ring.count,
                peer_slot_size=min(peer.ring.slot_size, mine.staging_size),
                staging=mine.staging,
                max_frame=self.max_frame,
                liveness=self._liveness,
            )

    def _abort(self, exc: TransferError) -> None:
        """Tells the peer why (best effort), releases the queue pair and the connection."""
        with contextlib.suppress(OSError, ssl.SSLError, TransferError):
            self._send_msg(b"E", str(exc).encode()[:MAX_MSG])
        if self.qp is not None:
            self.qp.close()
            self.qp = None
        self._closed = True
        with contextlib.suppress(Exception):
            self.tcp.close()

    def _first_info(self) -> conninfo.ConnInfo:
        try:
            return self._expect_info()
        except TimeoutError:
            raise ProtocolError(
                "the receiver accepted but offered no RDMA setup: is it running `rq recv --transport rdma`?"
            ) from None

    def _expect_info(self) -> conninfo.ConnInfo:
        tag, body = self._read_msg()
        if tag == b"E":
            raise RdmaDeviceError(f"peer could not set up RDMA: {body.decode(errors='replace')}")
        if tag != b"I":
            raise ProtocolError(f"expected RDMA connection info, got {tag!r}")
        return conninfo.decode(body)

    def _send_msg(self, tag: bytes, body: bytes = b"") -> None:
        self.tcp.sock.sendall(MSG.pack(tag, len(body)) + body)

    def _read_exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            got = self.tcp.sock.recv(n - len(buf))
            if not got:
                raise PeerUnreachableError("the peer closed the connection during RDMA setup")
            buf += got
        return bytes(buf)

    def _read_msg(self) -> tuple[bytes, bytes]:
        tag, length = MSG.unpack(self._read_exact(MSG.size))
        if length > MAX_MSG:
            raise ProtocolError(f"RDMA setup message of {length} bytes")
        return tag, self._read_exact(length)

    def _liveness(self) -> None:
        """Raises when the peer said goodbye or its bootstrap connection closed. Cheap: a non-blocking
        look at most every 20 ms; a TLS record that is not application data (a late session ticket)
        reads as nothing and is ignored."""
        now = time.monotonic()
        if self._cut_at is not None:
            # our listener shut the read side: the peer cannot be watched there any more. What is
            # left to send (the receiver's ERROR) gets the listener's grace, then the pipe breaks
            # (its close() cuts the connection whole then: transfer.tcp.CLOSE_GRACE).
            from transfer.tcp import CLOSE_GRACE

            if now - self._cut_at > CLOSE_GRACE:
                raise PeerUnreachableError("the receiver shut down")
            return
        if now - self._last_check < 0.02:
            return
        self._last_check = now
        sock = self.tcp.sock
        pending = isinstance(sock, ssl.SSLSocket) and sock.pending() > 0
        if not pending and not select.select([sock], [], [], 0)[0]:
            return
        try:
            sock.setblocking(False)
            got = sock.recv(MSG.size - len(self._live))
        except (ssl.SSLWantReadError, BlockingIOError):
            return
        except (OSError, ssl.SSLError):
            self._interrupted()
            raise PeerUnreachableError("the peer went away (its RDMA bootstrap connection broke)") from None
        finally:
            with contextlib.suppress(OSError):
                sock.setblocking(True)
        if not got:
            self._interrupted()
            raise PeerUnreachableError("the peer went away (its RDMA bootstrap connection closed)")
        self._live += got
        if len(self._live) < MSG.size:
            return
        tag, _ = MSG.unpack(bytes(self._live))
        if tag == b"B":
            raise PeerClosed("the peer closed the channel")
        raise ProtocolError(f"unexpected RDMA bootstrap message {tag!r}")

    def _interrupted(self) -> None:
        """Raises Interrupted (the pipe stays whole) when the bootstrap ended because this side's
        listener is closing, not because the peer went: once, then _liveness bounds the rest."""
        if self.shutting_down:
            self._cut_at = time.monotonic()
            raise Interrupted("the receiver is shutting down")


# -- connection, listener, transport ------------------------------------------------------------


def _tls_only(opts: Any) -> Any:
    # The connection info must reach the right peer unaltered: never bootstrap RDMA without TLS.
    return dataclasses.replace(opts, tls=True)


class RdmaConnection:
    def __init__(self, opts: ConnectOptions, settings: RdmaSettings):
        from transfer.tcp import TcpConnection

        if not opts.pin:
            raise AuthError("RDMA needs the receiver's certificate fingerprint (--pin) for its TLS bootstrap")
        self.opts = _tls_only(opts)
        self.settings = settings
        self.inner = TcpConnection(self.opts)
        self._channels: list[RdmaChannel] = []

    def open_channel(self) -> Channel:
        ch = RdmaChannel(
            self.inner.open_channel(), acceptor=False, settings=self.settings, max_frame=self.opts.max_frame
        )
        self._channels.append(ch)
        return ch

    def close(self) -> None:
        for ch in self._channels:
            with contextlib.suppress(Exception):
                ch.close()
        self._channels.clear()
        self.inner.close()


class RdmaListener:
    def __init__(self, opts: ListenOptions, handler: Callable[[Channel], None], settings: RdmaSettings):
        from transfer.tcp import TcpListener

        opts = _tls_only(opts)

        def wrapped(tcp_channel: Channel) -> None:
            ch = RdmaChannel(tcp_channel, acceptor=True, settings=settings, max_frame=opts.max_frame)
            try:
                handler(ch)
            finally:
                ch.close()

        self.inner = TcpListener(opts, wrapped)
        self.address = self.inner.address

    def serve_forever(self) -> None:
        self.inner.serve_forever()

    def close(self) -> None:
        self.inner.close()


class RdmaTransport:
    name = "rdma"
    connection_per_process = False  # the adapter moves the bytes; one process keeps up

    def listen(self, opts: ListenOptions, handler: Callable[[Channel], None]) -> RdmaListener:
        settings = RdmaSettings.from_extra(opts.extra)
        _open_now(settings)
        return RdmaListener(opts, handler, settings)

    def connect(self, opts: ConnectOptions) -> RdmaConnection:
        settings = RdmaSettings.from_extra(opts.extra)
        _open_now(settings)
        return RdmaConnection(opts, settings)


def _open_now(settings: RdmaSettings) -> None:
    """A wrong --rdma-device/--rdma-port/--gid-index fails at start, not when the first peer arrives."""
    from transfer.rdma import verbs

    verbs.open_device(settings.device, settings.port, settings.gid_index)
