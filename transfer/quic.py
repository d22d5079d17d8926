"""The QUIC driver: aioquic (or qh3, its faster fork) with TLS 1.3; one channel per bidirectional stream.

The asyncio loop and the QUIC state machine live in one thread per connection (sender) or listener
(receiver); channels hand frames across with thread-safe queues, so the glue stays blocking like
for TCP. Datagram size decides aioquic's speed more than anything: by default it is the path MTU
(IP_MTU of a connected UDP socket, 65536 on loopback) minus headers, capped at 16383 for aioquic —
whose 2-byte length fields silently corrupt larger datagrams — and at 65000 for qh3. The socket is
read in bursts (`_read_bursts`): every waiting datagram in one loop callback, one transmit per
connection after it, where aioquic's own reader transmits after every datagram.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import importlib
import logging
import queue
import socket
import ssl
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from transfer.credentials import fingerprint, normalise_pin
from transfer.errors import AuthError, PeerUnreachableError, ProtocolError, TransferError, UnsupportedError
from transfer.frames import HEADER, PRE_AUTH_LIMIT, BodyPool, Frame, FrameDecoder, FrameType, parse_header
from transfer.slots import MAX_UNAUTHENTICATED, MAX_UNAUTHENTICATED_PER_PEER, PreAuthSlots
from transfer.transport import Channel, ConnectOptions, ListenOptions

_log = logging.getLogger(__name__)  # the library never prints; rq -v shows INFO, -vv DEBUG
_dropped = [0]  # datagrams the QUIC library refused, in this process


def _level(count: int) -> int:
    """INFO for the 1st, 2nd, 4th, 8th… of a repeated event, DEBUG for the rest."""
    return logging.INFO if count & (count - 1) == 0 else logging.DEBUG


ALPN = ["rq-transfer/1"]
AIOQUIC_MAX_DATAGRAM = 16383
MIN_DATAGRAM = 1200  # QUIC's smallest (RFC 9000 section 14): every path that carries QUIC carries it
# A handshake at the route's datagram size that hears nothing back for this long is tried again
# at the kernel's path MTU or MIN_DATAGRAM: aioquic does not probe the path, and where the route's
# MTU is larger than the path's and no ICMP comes back (a black hole) every datagram is lost.
PROBE_FOR = 1.5
QH3_MAX_DATAGRAM = 65000
SOCKET_BUFFER = 8 * 1024 * 1024
IDLE_TIMEOUT = 10.0  # a silent peer is gone after this; clients ping every KEEPALIVE to stay alive
KEEPALIVE = 2.0
_CLOSED = object()
# Frames an unauthenticated stream may have waiting for its handler (each at most PRE_AUTH_LIMIT):
# the handshake needs one at a time. More is a peer pouring data in; its stream is refused.
PRE_AUTH_QUEUE = 4
# Bytes held behind an AUTH frame until the handler checked it: a MANIFEST (Limits.max_manifest_bytes,
# 32 MiB) and its header. Only bytes that really arrived in the moment before the verdict count.
PRE_AUTH_HOLD = 32 * 1024 * 1024 + 1024
# Streams that have not authenticated, at once, per listener and per address (transfer.slots); more
# are refused (no thread each). Connections too: one whose handshake completed holds a slot of its
# own (the same caps, a pool apart) until one of its streams authenticated, and is closed at once
# past the caps, or once PRE_AUTH_CONNECTION seconds passed without that. Before, a connection that
# opened no stream held no slot, and pings kept it past the idle timeout: one host held 300 (~0.1 MiB
# and a share of the loop's time each) for as long as it liked.
PRE_AUTH_CONNECTION = 60.0  # two pre-auth frames' worth (receiver.PRE_AUTH_TIMEOUT, 30 s each)
CONNECTION_REFUSED = 0x2  # QUIC's transport error code (RFC 9000 section 20.1)
# Connections whose handshake has not completed, past which new ones must first prove their address
# with a Retry (RFC 9000 section 8.1.2): each Initial from an address nobody validated cost the
# receiver a connection's state (~0.1 MiB) and a TLS handshake's CPU (~1.3 ms) until its idle
# timeout, and its source may be forged, so no per-address cap can hold it (measured: 3,000 Initials
# in 4 s took rq recv from 45 to 344 MiB and 3.9 CPU-s). Retry costs an honest sender one round trip,
# so it is asked only while that many are open, and until half as many and RETRY_HOLD seconds
# after it was last needed (a client that got a Retry comes back with its token).
MAX_HANDSHAKING = 64
RETRY_HOLD = 10.0
# A server connection whose handshake has not completed after this is closed: qh3 never times out
# one whose client went silent mid-handshake (its state, and its place in MAX_HANDSHAKING, were
# kept for the receiver's life, so Retry never turned off again); aioquic's idle timeout does it.
HANDSHAKE_LIMIT = IDLE_TIMEOUT
MAX_TOKENS_KEPT = 10_000  # Retry tokens awaited back (_Tokens): ~1 MB at most under a flood
STOPPED = 0x100  # application error code in STOP_SENDING: the receiver wants no more on this stream


class _Backend:
    """The aioquic or qh3 modules (same API; qh3 is a fork)."""

    def __init__(self, name: str):
        self.name = name
        try:
            self.asyncio: ModuleType = importlib.import_module(f"{name}.asyncio")
            self.protocol: ModuleType = importlib.import_module(f"{name}.asyncio.protocol")
            self.server: ModuleType = importlib.import_module(f"{name}.asyncio.server")
            self.config: ModuleType = importlib.import_module(f"{name}.quic.configuration")
            self.connection: ModuleType = importlib.import_module(f"{name}.quic.connection")
            self.events: ModuleType = importlib.import_module(f"{name}.quic.events")
        except ImportError as exc:
            # qh3 is the optional one (the rqcli[qh3] extra); aioquic comes with rq itself
            fix = (
                "pip install 'rqcli[qh3]', or use --quic-backend aioquic"
                if name == "qh3"
                else "reinstall rqcli"
            )
            raise UnsupportedError(
                f"QUIC backend {name} is not installed ({exc}): {fix}, or --transport tcp"
            ) from None
        self.max_datagram = QH3_MAX_DATAGRAM if name == "qh3" else AIOQUIC_MAX_DATAGRAM
        # qh3 keeps a stream's send buffer in Rust; only get_send_buffer_size (qh3 >= 2.1) tells how
        # much of it has not gone out. Without it a sender cannot see progress or be held back: a
        # slow healthy link then looked stalled once the window was handed over.
        self.unsent_of: Callable[[Any, int], int] | None = None
        if name == "qh3":
            if not hasattr(self.connection.QuicConnection, "get_send_buffer_size"):
                raise UnsupportedError(
                    "QUIC backend qh3 is older than 2.1 (no get_send_buffer_size); "
                    "upgrade it (pip install 'qh3>=2.1') or use --quic-backend aioquic"
                )
            self.unsent_of = lambda quic, stream_id: int(quic.get_send_buffer_size(stream_id))


def pick_backend(choice: str) -> _Backend:
    if choice == "auto":
        try:
            return _Backend("qh3")
        except UnsupportedError:
            return _Backend("aioquic")
    return _Backend(choice)


def path_datagram_size(host: str, port: int, cap: int) -> int:
    """The largest UDP payload the route to host allows (without IP fragmentation), up to `cap`."""
    try:
        info = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        with socket.socket(info[0], socket.SOCK_DGRAM) as s:
            s.connect(info[4])
            return _route_datagram(s, cap)
    except OSError:
        return MIN_DATAGRAM


def _quiet_waiter(proto: Any) -> None:
    """The library fails its handshake waiter (ConnectionError) as the connection closes; with
    nobody awaiting it any more (a wait that timed out), asyncio logged "Future exception was never
    retrieved" and its traceback on stderr, three lines per failed reconnect."""
    waiter = getattr(proto, "_connected_waiter", None)
    if isinstance(waiter, asyncio.Future):
        waiter.add_done_callback(lambda f: f.cancelled() or f.exception())


def _route_datagram(sock: socket.socket, cap: int) -> int:
    """The UDP payload a connected socket's route carries unfragmented (the link MTU, or the path
    MTU the kernel learned from ICMP), within [MIN_DATAGRAM, cap]. Raises OSError."""
    if sock.family == socket.AF_INET6:
        mtu, overhead = sock.getsockopt(socket.IPPROTO_IPV6, 24), 48  # IPV6_MTU (Linux)
    else:
        mtu, overhead = sock.getsockopt(socket.IPPROTO_IP, 14), 28  # IP_MTU (Linux)
    return max(MIN_DATAGRAM, min(cap, mtu - overhead))


def _dont_fragment(sock: socket.socket, on: bool) -> None:
    """IP_PMTUDISC_DO (on) or _WANT (off, the kernel's default): with DO a datagram over the
    path MTU the kernel knows fails with EMSGSIZE instead of leaving in fragments (Linux values;
    Python's socket module lacks the names)."""
    level, opt = (socket.IPPROTO_IPV6, 23) if sock.family == socket.AF_INET6 else (socket.IPPROTO_IP, 10)
    with contextlib.suppress(OSError):
        sock.setsockopt(level, opt, 2 if on else 1)


def _big_buffers(sock: socket.socket) -> None:
    for force, plain in ((33, socket.SO_RCVBUF), (32, socket.SO_SNDBUF)):  # SO_RCVBUFFORCE/SO_SNDBUFFORCE
        try:
            sock.setsockopt(socket.SOL_SOCKET, force, SOCKET_BUFFER)
        except OSError:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, plain, SOCKET_BUFFER)


SEND_BACKLOG = 8 << 20  # most bytes a stream may hold in aioquic's send buffer (see _wait_for_room)
STALL_TIMEOUT = 60.0  # a backlog that does not move for this long means the peer is gone
# QuicListener.close(): how long the handlers of streams still open get to end once woken, then
# how long after their channels failed (as transfer.tcp's CLOSE_GRACE, CLOSE_LIMIT)
CLOSE_GRACE = 1.0
CLOSE_LIMIT = 5.0
COPY_BELOW = 64 * 1024  # frames up to this size are copied and queued; bigger ones wait for the loop


class QuicChannel:
    """One bidirectional QUIC stream as a channel."""

    # A CHUNK body lives in a BodyPool buffer until the next recv() (body_lifetime 1): the receiver
    # writes inline. A writer thread (lifetime 2) measured ~4% slower, and no faster once the loop
    # read in bursts: the receiving process is CPU-bound, one more thread only competes for the GIL.
    body_lifetime = 1
    # set by the listener's close() before it ends the channel: the receiver tells an authenticated
    # sender that it shut down, not that its connection failed
    shutting_down = False

    def __init__(
        self,
        proto: Any,
        stream_id: int,
        loop: asyncio.AbstractEventLoop,
        max_frame: int,
        frame_limit: int | None = None,
        on_authenticated: Callable[[], None] | None = None,
    ):
        self._proto = proto
        self.stream_id = stream_id
        self._loop = loop
        self._max = max_frame
        self._pool = BodyPool()
        self.decoder = FrameDecoder(max_frame, self._pool)
        self._lent: list[memoryview] = []  # pool buffers behind bodies recv() handed out
        self.frames: queue.Queue[Any] = queue.Queue()
        self._closed = False
        self._readers = 0  # threads blocked in recv: close() wakes each (see _wake_readers)
        self._readers_lock = threading.Lock()
        self._error: BaseException | None = None
        self._dropping = False  # closed or refused: what still arrives is discarded, not queued
        # Until the peer authenticated (the listener passes frame_limit; the handler lifts it), the
        # loop thread splits frames itself, one at a time, against that limit: it runs before the
        # handler thread does, and a header may announce any size. Bytes after an AUTH frame are
        # held raw until the handler's verdict: the sender pipelines its MANIFEST (up to 32 MiB)
        # right behind AUTH, which the pre-auth limit must not refuse and nobody may preallocate.
        self._limit = frame_limit
        self._pre_auth = frame_limit is not None
        self._lock = threading.Lock()  # the loop's _deliver against the handler lifting the limit
        self._pre = bytearray()
        self._holding = False
        self._pre_end = False
        self._on_authenticated = on_authenticated
        self._handed = 0  # bytes given to the QUIC library for this stream
        # qh3 only: bytes of this stream not yet sent once, read on the loop thread after each
        # transmit (qh3 is not thread-safe, so the sender's threads never call into it)
        self._unsent: int | None = None

    def progress(self) -> int:
        """A count that grows as the bytes sent reach the peer (see TcpChannel.progress): those
        handed to the library less the backlog it still holds. aioquic's backlog runs until the
        peer acknowledges; qh3's until the bytes are first sent, which stops as surely when the peer
        stops reading (flow control) or vanishes (congestion window)."""
        return self._handed - self._backlog()

    # called on the loop thread
    def _deliver(self, data: bytes, end: bool) -> None:
        if self._dropping or self._closed:
            return
        if self._pre_auth:
            with self._lock:
                if self._pre_auth:
                    self._deliver_pre_auth(data, end)
                    return
        try:
            for frame in self.decoder.feed(data):
                self.frames.put(frame)
        except TransferError as exc:
            self._refuse(exc)
            return
        if end:
            self.frames.put(_CLOSED)

    def _deliver_pre_auth(self, data: bytes, end: bool) -> None:
        self._pre += data
        self._pre_end = self._pre_end or end
        if self._holding:
            if len(self._pre) > PRE_AUTH_HOLD:
                self._refuse(ProtocolError("peer sent more than a manifest behind its AUTH"))
            return
        while len(self._pre) >= HEADER.size:
            try:
                kind, length = parse_header(self._pre[: HEADER.size], self._max, self._limit)
            except TransferError as exc:
                self._refuse(exc)
                return
            if len(self._pre) < HEADER.size + length:
                break
            body = bytearray(self._pre[HEADER.size : HEADER.size + length])
            del self._pre[: HEADER.size + length]
            self.frames.put(Frame(kind, memoryview(body)))
            if self.frames.qsize() > PRE_AUTH_QUEUE:
                self._refuse(ProtocolError("peer sent more frames than the handshake needs"))
                return
            if kind is FrameType.AUTH:
                self._holding = True  # what follows waits for the handler's verdict on it
                if len(self._pre) > PRE_AUTH_HOLD:
                    self._refuse(ProtocolError("peer sent more than a manifest behind its AUTH"))
                return
        if self._pre_end:
            self.frames.put(_CLOSED)

    def _refuse(self, exc: TransferError) -> None:
        """On the loop: the stream's data is unusable from here on. The handler gets `exc` (and
        may still send an ERROR frame); the peer is asked to stop sending."""
        self._dropping = True
        self._pre = bytearray()
        self.frames.put(exc)
        self._stop_receiving()

    @property
    def stopped(self) -> bool:
        """Whether this side refused or closed the stream (and asked the peer to stop sending)."""
        return self._dropping

    def _stop_receiving(self) -> None:
        with contextlib.suppress(Exception):
            self._proto._quic.stop_stream(self.stream_id, STOPPED)
            self._proto.transmit()

    def turn_away(self) -> None:
        """On the loop: a stream the listener will not serve. Both directions are reset, and what
        the peer still sends on it is dropped."""
        self._dropping = self._closed = True
        self._stop_receiving()
        with contextlib.suppress(Exception):
            self._proto._quic.reset_stream(self.stream_id, STOPPED)
            self._proto.transmit()

    @property
    def frame_limit(self) -> int | None:
        return self._limit

    @frame_limit.setter
    def frame_limit(self, value: int | None) -> None:
        """The handler lifts the limit (None) once the peer authenticated: the bytes held behind
        AUTH are decoded here, in the handler's thread, and the loop decodes directly from now on."""
        with self._lock:
            self._limit = value
            if value is not None or not self._pre_auth:
                return
            held, self._pre = self._pre, bytearray()
            try:
                if not self._dropping:
                    for frame in self.decoder.feed(held):
                        self.frames.put(frame)
                    if self._pre_end:
                        self.frames.put(_CLOSED)
            except TransferError as exc:
                self._dropping = True
                self.frames.put(exc)
            self._holding = False
            self._pre_auth = False
        callback, self._on_authenticated = self._on_authenticated, None
        if callback is not None:
            callback()
        trusted = getattr(self._proto, "authenticated", None)
        if callable(trusted):
            trusted()

    def release_slot(self) -> None:
        """This stream stops counting as unauthenticated (idempotent)."""
        callback, self._on_authenticated = self._on_authenticated, None
        if callback is not None:
            callback()

    def _backlog(self) -> int:
        """Bytes aioquic holds for this stream, sent or not, until the peer acknowledges them; with
        qh3, those not yet sent (its buffer is in Rust; see _Backend.unsent_of)."""
        if self._unsent is not None:
            return self._unsent
        stream = getattr(self._proto._quic, "_streams", {}).get(self.stream_id)
        buf = getattr(getattr(stream, "sender", None), "_buffer", None)
        return len(buf) if isinstance(buf, bytearray) else 0

    def _wait_for_room(self) -> None:
        """Holds the caller until aioquic's stream buffer is under SEND_BACKLOG.

        aioquic keeps a stream's unacknowledged data in one bytearray that it trims from the front
        as ACKs come and appends to on every write; once trimmed, an append that outgrows the
        allocation copies the whole backlog into a fresh one. With a window of 8 × 4 MiB chunks that
        was up to 32 MiB copied, into memory this VM backs slowly, per chunk, on the event-loop thread
        that is the bottleneck. Alternated (1 GiB, aioquic, 1 connection): no cap 6.97–8.51 s, 8 MiB
        5.98–7.33 s, 4 MiB 6.29–6.50 s, 2 MiB 6.76–6.78 s. The raw sender in the bench keeps the same
        8 MiB bound."""
        last, since = -1, time.monotonic()
        while (backlog := self._backlog()) > SEND_BACKLOG:
            if self._closed or self._error is not None:
                return  # the caller's next send, or its reader, reports the failure
            now = time.monotonic()
            if backlog != last:
                last, since = backlog, now
            elif now - since > STALL_TIMEOUT:
                raise PeerUnreachableError(f"QUIC stream made no progress for {STALL_TIMEOUT:.0f} s")
            time.sleep(0.001)

    def send(self, *parts: bytes | bytearray | memoryview) -> None:
        if self._closed:
            raise PeerUnreachableError("QUIC stream is closed")
        if self._error is not None:
            raise PeerUnreachableError(f"QUIC send failed: {self._error}")
        self._wait_for_room()
        if sum(len(p) for p in parts) <= COPY_BELOW:
            # a control frame or an ACK: one small copy, and the caller goes on without waiting
            self._on_loop(self._queue_parts, (b"".join(parts),))
            return
        # A chunk: the loop thread copies it straight from the caller's buffers into the library's
        # send buffer, and the caller waits for that before it reuses them. Joining it here first
        # was one more copy of every byte, into fresh memory each time: alternated 1 GiB qh3 sends
        # took 2.17-2.27 s that way and 1.55-1.63 s this way.
        done = threading.Event()

        def _copy(parts: tuple[bytes | bytearray | memoryview, ...]) -> None:
            self._queue_parts(parts)
            done.set()

        self._on_loop(_copy, parts)
        # A loop that stopped runs nothing more (run_forever has returned, this callback with it):
        # then the caller's buffers are its own again, and the connection is gone.
        while not done.wait(0.5):
            if not self._loop.is_running() and not done.is_set():
                raise PeerUnreachableError("QUIC connection is closed")

    def _queue_parts(self, parts: tuple[bytes | bytearray | memoryview, ...]) -> None:
        """On the loop: hands the parts to the QUIC library (which copies them) and transmits."""
        try:
            for p in parts:
                self._proto._quic.send_stream_data(self.stream_id, p, False)
                self._handed += len(p)
            self._proto.transmit()
        except BaseException as exc:
            self._error = exc

    def _on_loop(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:
            raise PeerUnreachableError("QUIC connection is closed") from None

    def readable(self) -> bool:
        """A frame (or the end) is queued: recv would not block. The receiver makes a batch of
        small chunks durable when this turns False (receiver._Readiness)."""
        return not self.frames.empty()

    def recv(self, timeout: float | None = None) -> Frame | None:
        # the body handed out last is the caller's no longer: its buffer takes a later chunk
        while self._lent:
            self._pool.give(self._lent.pop())
        with self._readers_lock:
            if self._closed:
                return None  # close() dropped what was queued
            self._readers += 1
        try:
            item = self.frames.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError("no frame within the timeout") from None
        finally:
            with self._readers_lock:
                self._readers -= 1
        if item is _CLOSED:
            if not self._closed:
                self.frames.put(_CLOSED)  # the peer's end: every later recv hears it too
            return None
        if isinstance(item, BaseException):
            self.frames.put(item)
            raise item
        assert isinstance(item, Frame)
        if item.lease is not None:
            self._lent.append(item.lease)
        return item

    def close(self) -> None:
        with self._readers_lock:
            if self._closed:
                return
            self._closed = True  # _deliver queues nothing more
            self._drain()
            # a thread still blocked in recv (the sender's reply reader) hears the end: it waited
            # for good where the loop stopped before the peer's FIN or the connection's end came
            for _ in range(self._readers):
                self.frames.put(_CLOSED)
        self._release_buffers()

        def _on_loop() -> None:
            self._dropping = True
            self._drain(keep_ends=True)  # what the loop queued before it saw _closed
            self.decoder.drop_partial()
            if not self._peer_finished():
                self._stop_receiving()
            with contextlib.suppress(Exception):
                self._proto._quic.send_stream_data(self.stream_id, b"", True)
                self._proto.transmit()

        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(_on_loop)

    def _drain(self, keep_ends: bool = False) -> None:
        with self.frames.mutex:
            ends = sum(1 for x in self.frames.queue if x is _CLOSED) if keep_ends else 0
            self.frames.queue.clear()
            self.frames.queue.extend([_CLOSED] * ends)  # close()'s wake-ups for blocked readers

    def _release_buffers(self) -> None:
        """The pool's buffers go with the channel, not whenever the cyclic garbage collector gets
        to it (a channel and its connection's protocol refer to each other): a long-running
        `rq recv` would otherwise hold up to 8 chunk-sized buffers per finished stream."""
        self._lent.clear()
        self._pool.clear()

    def _peer_finished(self) -> bool:
        """Whether the peer already ended its side (FIN or reset): then there is nothing to stop."""
        stream = getattr(self._proto._quic, "_streams", {}).get(self.stream_id)
        receiver = getattr(stream, "receiver", None)
        return bool(getattr(receiver, "is_finished", False))

    def interrupt(self, exc: BaseException) -> None:
        """Wakes the channel's reader with `exc`; sends still go out (a reply, an ERROR, the FIN)."""
        if not self._closed:
            self.frames.put(exc)

    def fail(self, exc: BaseException) -> None:
        self._error = self._error or exc  # a sender waiting for buffer room stops waiting
        if not self._closed:  # once closed nobody reads the queue
            self.frames.put(exc)


class _Tokens:
    """The backend's Retry token handler, keeping the tokens it gave that have not come back yet
    (RETRY_HOLD at most, MAX_TOKENS_KEPT of them): a client given one returns with it about a round
    trip later, and Retry must not be turned off meanwhile (the server would ignore the token and
    the client's handshake fail). A token that came back, or is older, no longer holds Retry on:
    while Retry is on every client is given one, so "a token given lately" alone kept it on for good."""

    def __init__(self, inner: Any):
        self._inner = inner
        self._out: dict[bytes, float] = {}  # token -> when given, oldest first

    def create_token(self, *args: Any, **kwargs: Any) -> Any:
        token = self._inner.create_token(*args, **kwargs)
        self._out[bytes(token)] = time.monotonic()  # asyncio's loop time
        while len(self._out) > MAX_TOKENS_KEPT:  # a flood: the oldest count as never coming back
            del self._out[next(iter(self._out))]
        return token

    def validate_token(self, *args: Any, **kwargs: Any) -> Any:
        token = kwargs.get("token", args[-1] if args else b"")
        got = self._inner.validate_token(*args, **kwargs)  # raises for a bad token
        self._out.pop(bytes(token), None)
        return got

    def awaited(self, now: float) -> bool:
        """Whether a token given less than RETRY_HOLD ago has not come back yet."""
        while self._out:
            first = next(iter(self._out))
            if now - self._out[first] < RETRY_HOLD:
                return True
            del self._out[first]
        return False


class _Handshakes:
    """Server: the connections whose handshake has not completed, and Retry (address validation)
    while they are many (MAX_HANDSHAKING). Used on the loop thread only."""

    def __init__(self, backend: _Backend):
        self.backend = backend
        self.server: Any = None  # the QuicServer, once made
        self.count = 0
        self.retries = 0  # times Retry was turned on
        self._needed_at = -1e18
        # one handler for the listener's life: a new one turned on again would refuse (INVALID_TOKEN)
        # the tokens the last one issued to clients still on their way back
        self._tokens: _Tokens | None = None
        self._recheck: asyncio.TimerHandle | None = None

    def started(self, now: float) -> None:
        self.count += 1
        if self.count >= MAX_HANDSHAKING:
            self._needed_at = now
            if self.server is not None and self.server._retry is None:
                if self._tokens is None:  # made on first need: qh3's makes an RSA key (~70 ms)
                    self._tokens = _Tokens(self.backend.server.QuicRetryTokenHandler())
                self.server._retry = self._tokens
                self.retries += 1

    def ended(self, now: float, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.count -= 1
        self._maybe_off(now, loop)

    def _maybe_off(self, now: float, loop: asyncio.AbstractEventLoop | None) -> None:
        """Turns Retry off once few handshakes are open, none was refused for RETRY_HOLD and no
        token given lately is on its way back; else, when only time stands in the way, looks again
        later (nothing else may end to ask: the flood stopped and no client came)."""
        if self.server is None or self.server._retry is None or self.count >= MAX_HANDSHAKING // 2:
            return
        if now - self._needed_at >= RETRY_HOLD and not (
            self._tokens is not None and self._tokens.awaited(now)
        ):
            self.server._retry = None
            return
        if loop is not None and self._recheck is None:

            def again() -> None:
                self._recheck = None
                self._maybe_off(loop.time(), loop)

            self._recheck = loop.call_later(RETRY_HOLD / 2, again)

    @property
    def retrying(self) -> bool:
        return self.server is not None and self.server._retry is not None


def _protocol_class(
    backend: _Backend,
    on_stream: Callable[[Any, int], QuicChannel | None],
    burst: _Burst,
    on_connected: Callable[[Any], None] | None = None,
    handshakes: _Handshakes | None = None,
) -> type:
    base = backend.protocol.QuicConnectionProtocol
    ev = backend.events
    unsent_of = backend.unsent_of

    class Proto(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.channels: dict[int, QuicChannel] = {}
            self.peer = ""  # the address datagrams come from (validated by the handshake)
            self.terminated: str | None = None
            self.transmit_failures = 0
            self.heard = False  # a datagram came from the peer (the path carries its replies)
            self.too_big = asyncio.Event()  # a send failed with EMSGSIZE (see _dont_fragment)
            self.refused = False  # ICMP port unreachable came (client): see _tell_refused
            self.read_queued: Callable[[], None] | None = None  # set by _read_bursts
            # server: gives back the connection's unauthenticated slot (QuicListener._on_connected)
            self.release_connection: Callable[[], None] | None = None
            self.trusted = False  # server: one of its streams authenticated
            self._shaking = handshakes is not None  # server: counted in `handshakes` until it ends
            if handshakes is not None:
                handshakes.started(self._loop.time())
                self._loop.call_later(HANDSHAKE_LIMIT, self._handshake_overdue)

        def _handshake_overdue(self) -> None:
            if not self._shaking:
                return
            self._shaken()
            with contextlib.suppress(Exception):  # the library's own errors: see below
                self._quic.close(error_code=0, reason_phrase="the handshake did not complete in time")
                self.transmit()

        def _shaken(self) -> None:
            if self._shaking and handshakes is not None:
                self._shaking = False
                handshakes.ended(self._loop.time(), self._loop)

        def authenticated(self) -> None:
            """A stream of this connection authenticated (any thread): it no longer counts as a
            connection that has not, and is never closed for that."""
            self.trusted = True
            release, self.release_connection = self.release_connection, None
            if release is not None:
                release()

        # The QUIC library's own errors escaped these into asyncio, which printed a traceback on
        # stderr for each: qh3 raises "packet builder capacity exhausted" from transmit() during an
        # aioquic peer's handshake, over and over (measured: ~60 per attempt). They go to the debug
        # log. Nothing is retried here: the next datagram from the peer transmits again, and a
        # connection that can no longer send ends by idle timeout, failing its channels as before.

        def datagram_received(self, data: Any, addr: Any) -> None:
            self.peer = str(addr[0])
            self.heard = True
            try:
                if burst.open:
                    # inside a burst: take the datagram in, transmit once when the burst ends
                    self._quic.receive_datagram(data, addr, now=self._loop.time())
                    self._process_events()
                    burst.touched.add(self)
                else:
                    super().datagram_received(data, addr)
            except Exception as exc:
                if not _from_quic_library(exc, (backend.name,)):
                    raise
                _dropped[0] += 1
                # every one at DEBUG (rq -vv); the 1st, 2nd, 4th, 8th… at INFO (rq -v): a flood of
                # them must not flood stderr
                _log.log(
                    _level(_dropped[0]),
                    "QUIC datagram dropped (%d so far): %s",
                    _dropped[0],
                    exc,
                    exc_info=exc,
                )

        def transmit(self) -> None:
            try:
                super().transmit()
                if unsent_of is not None:
                    for ch in self.channels.values():
                        ch._unsent = unsent_of(self._quic, ch.stream_id)
            except Exception as exc:
                if not _from_quic_library(exc, (backend.name,)):
                    raise
                self.transmit_failures += 1
                _log.log(
                    _level(self.transmit_failures),
                    "QUIC transmit failed (%d so far): %s",
                    self.transmit_failures,
                    exc,
                    exc_info=exc,
                )

        def quic_event_received(self, event: Any) -> None:
            if isinstance(event, ev.StreamDataReceived):
                ch = self.channels.get(event.stream_id)
                if ch is None:
                    ch = on_stream(self, event.stream_id)
                    if ch is None:
                        return
                    self.channels[event.stream_id] = ch
                ch._deliver(event.data, event.end_stream)
                return  # the base class would wrap the stream in a StreamWriter whose __del__ sends FIN
            elif isinstance(event, ev.HandshakeCompleted):
                self._shaken()
                if on_connected is not None:
                    on_connected(self)  # the peer's address is validated now: count it against it
            elif isinstance(event, ev.ConnectionTerminated):
                self._shaken()
                self.terminated = event.reason_phrase or f"error {event.error_code}"
                release, self.release_connection = self.release_connection, None
                if release is not None:
                    release()
                for ch in self.channels.values():
                    ch.fail(PeerUnreachableError(f"QUIC connection closed: {self.terminated}"))
            elif isinstance(event, ev.StreamReset):
                ch = self.channels.get(event.stream_id)
                # a reset we asked for (STOP_SENDING) ends only the peer's half: our ERROR frame
                # may still be on its way out
                if ch is not None and not ch.stopped:
                    ch.fail(PeerUnreachableError("QUIC stream reset by peer"))
            super().quic_event_received(event)

        def error_received(self, exc: Exception) -> None:
            if isinstance(exc, OSError) and exc.errno == errno.EMSGSIZE:
                self.too_big.set()  # the kernel learned a smaller path MTU (ICMP) than we send
                return
            # ICMP port unreachable on our connected client socket: the receiver process is gone.
            # Waiting for the idle timeout would stall a resume for seconds; give up on it now,
            # once what it sent before it went is read (next turn: a send's error comes in the
            # middle of transmit()).
            refused = isinstance(exc, ConnectionRefusedError) and self._quic.configuration.is_client
            if refused and not self.refused:
                self.refused = True
                self._loop.call_soon(self._tell_refused)

        def _tell_refused(self) -> None:
            # Linux reports the pending ICMP error from send and recvfrom before the datagrams
            # already queued, which came first: a receiver's last words (its ERROR "shut down",
            # its close) were dropped unread and the sender said 'receiver is not listening'.
            if self.read_queued is not None:
                self.read_queued()
            if self.terminated is not None:
                return  # the receiver's own close was among them: it said why
            self.terminated = "receiver is not listening (ICMP port unreachable)"
            for ch in self.channels.values():
                ch.fail(PeerUnreachableError(self.terminated))
            self._quic.close()
            self.transmit()

    return Proto


class _Burst:
    """The protocols that took datagrams in during one read burst and must transmit after it."""

    def __init__(self) -> None:
        self.open = False
        self.touched: set[Any] = set()


BURST = 64  # datagrams read per loop callback at most, so timers and other callbacks still run
REFUSED_DRAIN = 4096  # datagrams read at most before an ICMP refusal is told


def _read_bursts(loop: asyncio.AbstractEventLoop, sock: socket.socket, endpoint: Any, burst: _Burst) -> None:
    """Replaces the datagram transport's reader: one loop callback drains up to BURST datagrams
    and each connection that took some in transmits once, instead of once per datagram.

    aioquic's protocol transmits after every datagram: ACK building, timer re-arming and a pass
    over every packet space, measured as a third of the receiver's loop time at 16 KB datagrams,
    while what it sends (an ACK every millisecond, flow-control credit) needs no such rate."""

    def _on_readable(limit: int = BURST) -> None:
        burst.open = True
        refused: ConnectionRefusedError | None = None
        try:
            n = 0
            while n < limit:
                n += 1
                try:
                    data, addr = sock.recvfrom(65536)
                except (BlockingIOError, InterruptedError):
                    break
                except ConnectionRefusedError as exc:
                    # an ICMP error is reported before the datagrams queued ahead of it: they are
                    # read first (see Proto._tell_refused)
                    refused, limit = exc, n + REFUSED_DRAIN
                    continue
                except OSError as exc:
                    endpoint.error_received(exc)
                    break
                endpoint.datagram_received(data, addr)
        finally:
            burst.open = False
            touched, burst.touched = burst.touched, set()
            for proto in touched:
                proto.transmit()
        if refused is not None:
            endpoint.error_received(refused)

    # The public add_reader refuses a descriptor a transport owns; the selector loop's own
    # _add_reader is what the transport itself registered with. The transport keeps sending and
    # closing; when it closes it removes whichever reader is registered. On a loop without these
    # (not the selector loop rq creates) the transport reads per datagram as before.
    swap = getattr(loop, "_add_reader", None), getattr(loop, "_remove_reader", None)
    if swap[0] is None or swap[1] is None:
        return
    if hasattr(endpoint, "read_queued"):
        endpoint.read_queued = lambda: _on_readable(REFUSED_DRAIN)
    swap[1](sock.fileno())
    swap[0](sock.fileno(), _on_readable)


def _from_quic_library(exc: BaseException, names: tuple[str, ...] = ("qh3", "aioquic")) -> bool:
    """Whether `exc` was raised inside the QUIC library (not by rq's code it called back)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    where = str(tb.tb_frame.f_globals.get("__name__", "")) if tb is not None else ""
    return any(m.split(".")[0] in names for m in (where, type(exc).__module__))


def _loop_exception(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """What still escapes into the event loop: the QUIC library's errors go to the debug log; the
    rest (rq's own bugs) to asyncio's default handler, which logs them with their traceback."""
    exc = context.get("exception")
    if exc is not None and _from_quic_library(exc):
        _log.info("QUIC event loop: %s", context.get("message"), exc_info=exc)
        return
    loop.default_exception_handler(context)


def _config(backend: _Backend, is_client: bool, datagram: int) -> Any:
    cfg = backend.config.QuicConfiguration(
        is_client=is_client,
        alpn_protocols=ALPN,
        max_datagram_size=datagram,
        idle_timeout=IDLE_TIMEOUT,
        max_data=64 * 1024 * 1024,
        max_stream_data=16 * 1024 * 1024,
    )
    if hasattr(cfg, "probe_datagram_size"):
        # qh3 probes the path MTU upward from max_datagram_size (client side): past a
        # --datagram-size it was told to keep to, and past a path's MTU once rq lets datagrams
        # fragment after the handshake (1472-byte datagrams on a 1300-MTU veth, each in two
        # fragments). rq picks the size itself (path_datagram_size, the handshake fallback).
        cfg.probe_datagram_size = False
    return cfg


class _LoopThread:
    def __init__(self, name: str):
        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(_loop_exception)
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def run(self, coro: Any, timeout: float | None = None) -> Any:
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout)
        except BaseException:
            # a timeout, or a KeyboardInterrupt in this wait: the coroutine is cancelled, so its own
            # clean-up (closing a half-made connection's socket) runs before stop() ends the loop
            fut.cancel()
            raise

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        if self.loop.is_running():
            # what is still running gets cancelled and a turn to clean up: a loop stopped under a
            # pending connect left its socket to the garbage collector
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(_wind_down(), self.loop).result(2)
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        with contextlib.suppress(RuntimeError):
            # also shuts the default executor down (getaddrinfo's thread): a loop never closed kept it
            self.loop.close()


async def _wind_down() -> None:
    me = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not me]
    for t in tasks:
        t.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=1)
    await asyncio.sleep(0)  # transports closed just now close their fds in connection_lost, next turn


class _NoAnswer(Exception):
    """A handshake at a datagram size heard nothing back: `fits` is what the route carries now."""

    def __init__(self, fits: int):
        super().__init__(fits)
        self.fits = fits


class QuicConnection:
    def __init__(self, opts: ConnectOptions):
        self.opts = opts
        self.backend = pick_backend(str(opts.extra.get("quic_backend", "auto")))
        cap = self.backend.max_datagram
        wanted = opts.extra.get("datagram_size")
        self.datagram = min(int(wanted), cap) if wanted else path_datagram_size(opts.host, opts.port, cap)
        # (tried, used): the route's datagram size got no answer and a smaller one did (a path
        # narrower than the link, with no ICMP to say so); the sender tells the user once
        self.datagram_fallback: tuple[int, int] | None = None
        self._transport: Any = None
        self._pinger: asyncio.Task[None] | None = None
        self._lt = _LoopThread("rq-quic-client")
        try:
            self.proto = self._lt.run(self._connect(fit=not wanted), timeout=opts.connect_within + 5)
        except TransferError:
            self._abandon()
            raise
        except (TimeoutError, ConnectionError, OSError) as exc:
            self._abandon()
            raise PeerUnreachableError(
                f"cannot reach {opts.where} over QUIC: {_why_unreachable(exc, opts.connect_within)}"
            ) from None
        except BaseException:
            # anything else, a KeyboardInterrupt included, goes on up; the loop thread, its executor
            # thread and the socket stayed behind for good in a process that carried on
            self._abandon()
            raise

    def _abandon(self) -> None:
        """A connect that did not finish: its socket is closed and its loop thread ends."""
        try:
            transport = self._transport
            if transport is not None and self._lt.loop.is_running():
                with contextlib.suppress(RuntimeError):
                    self._lt.loop.call_soon_threadsafe(transport.close)
        finally:
            self._lt.stop()

    async def _connect(self, fit: bool) -> Any:
        """Connects at self.datagram; with `fit` (no --datagram-size), a first try that hears
        nothing within PROBE_FOR is followed by one at the size the route carries by then (the
        path MTU the kernel learned from ICMP) or MIN_DATAGRAM, within the same timeout."""
        o = self.opts
        loop = asyncio.get_running_loop()
        info = (await loop.getaddrinfo(o.host, o.port, type=socket.SOCK_DGRAM))[0]
        limit = o.connect_within
        deadline = loop.time() + limit
        if fit and self.datagram > MIN_DATAGRAM and limit > PROBE_FOR:
            try:
                return await self._connect_at(info, PROBE_FOR, probe=True)
            except _NoAnswer as exc:
                tried, self.datagram = self.datagram, min(exc.fits, self.datagram)
                if self.datagram >= tried:
                    self.datagram = MIN_DATAGRAM
                _log.info("no answer at %d-byte datagrams; trying %d", tried, self.datagram)
                proto = await self._connect_at(info, max(0.1, deadline - loop.time()), probe=False)
                return await self._try_again_at(info, proto, tried)
        return await self._connect_at(info, limit, probe=False)

    async def _try_again_at(self, info: Any, small: Any, tried: int) -> Any:
        """The peer answered at the smaller size: its silence at `tried` may have been its own (a
        receiver restarting after a kill, stopped, starved), not the path's. One more try at `tried`
        (PROBE_FOR) settles it; only if that too hears nothing is the smaller size kept, and the
        fallback told. Before, a resume against a receiver restarted a second late sent 1200-byte
        datagrams for the whole transfer (23-28 against 130-460 MB/s on loopback), blaming the path."""
        small_size, small_transport, small_pinger = self.datagram, self._transport, self._pinger
        self.datagram = tried
        try:
            big = await self._connect_at(info, PROBE_FOR, probe=True)
        except Exception:  # (_NoAnswer, or anything else: the connection that works stays)
            self.datagram, self._transport, self._pinger = small_size, small_transport, small_pinger
            self.datagram_fallback = (tried, small_size)
            return small
        if small_pinger is not None:
            small_pinger.cancel()
        small.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(small.wait_closed(), 0.5)
        small_transport.close()
        return big

    async def _connect_at(self, info: Any, timeout: float, probe: bool) -> Any:
        o, b = self.opts, self.backend
        cfg = _config(b, True, self.datagram)
        cfg.server_name = "rq-recv"
        cfg.verify_mode = ssl.CERT_NONE  # the pin is the check: the certificate is self-signed by design
        pin = normalise_pin(o.pin or "")
        if b.name == "qh3":
            cfg.verify_hostname = False
            cfg.assert_fingerprint = pin.removeprefix("sha256:")
        sock = socket.socket(info[0], socket.SOCK_DGRAM)
        _big_buffers(sock)
        sock.bind(("::" if info[0] == socket.AF_INET6 else "0.0.0.0", 0))
        sock.connect(info[4])  # connected, so ICMP errors reach us (error_received)
        # During the handshake nothing leaves in fragments: where ICMP says the path is narrower,
        # sends fail (EMSGSIZE) and the next try uses the kernel's path MTU. After it, a path that
        # narrows mid-transfer gets fragments again, as before, rather than a stall.
        _dont_fragment(sock, True)
        conn = b.connection.QuicConnection(configuration=cfg)
        burst = _Burst()
        proto_cls = _protocol_class(b, lambda _p, _sid: None, burst)
        loop = asyncio.get_running_loop()
        try:
            self._transport, proto = await loop.create_datagram_endpoint(lambda: proto_cls(conn), sock=sock)
        except BaseException:
            sock.close()
            raise
        try:
            _read_bursts(loop, sock, proto, burst)
            proto.connect(info[4])
            await self._handshake(proto, pin, timeout, probe)
        except BaseException as exc:
            fits = self.datagram
            if isinstance(exc, _NoAnswer):
                with contextlib.suppress(OSError):
                    fits = _route_datagram(sock, self.backend.max_datagram)
                exc.fits = fits
            _quiet_waiter(proto)  # (a reconnect that timed out waiting: np saw it on each retry)
            # the protocol's close() only sends CONNECTION_CLOSE: the socket stayed open until the
            # garbage collector found it (a process sending many checkpoints leaked one per failure)
            proto.close()
            self._transport.close()
            raise
        _dont_fragment(sock, False)
        self._pinger = loop.create_task(self._keepalive(proto))
        return proto

    async def _handshake(self, proto: Any, pin: str, timeout: float, probe: bool) -> None:
        """Waits for the handshake; with `probe`, raises _NoAnswer where nothing came back within
        `timeout`, or where a send was too big for the path MTU the kernel learned meanwhile."""
        try:
            if probe:
                await self._probe(proto, timeout)
            else:
                await asyncio.wait_for(proto.wait_connected(), timeout)
        except _NoAnswer:
            raise
        except BaseException:
            reason = str(getattr(proto, "terminated", "") or "")
            if "ingerprint" in reason or "certificate" in reason.lower():
                raise AuthError(f"receiver certificate does not match the pin {pin}") from None
            raise
        if self.backend.name == "aioquic":
            cert = getattr(proto._quic.tls, "_peer_certificate", None)
            der = cert.public_bytes(_der()) if cert is not None else b""
            if fingerprint(der) != pin:
                raise AuthError(f"receiver certificate {fingerprint(der)} does not match the pin {pin}")

    async def _probe(self, proto: Any, timeout: float) -> None:
        connected = asyncio.ensure_future(proto.wait_connected())
        too_big = asyncio.ensure_future(proto.too_big.wait())
        try:
            done, _ = await asyncio.wait({connected, too_big}, timeout=timeout, return_when="FIRST_COMPLETED")
            if connected in done:
                connected.result()
                return
            if too_big in done or not proto.heard:
                raise _NoAnswer(self.datagram)
            # the peer answers but the handshake is slow (a long or lossy path): not the datagram
            # size's fault; it goes on at this size for the rest of the timeout
            await asyncio.wait_for(connected, max(0.1, self.opts.connect_within - timeout))
        finally:
            for task in (connected, too_big):
                task.cancel()
            _quiet_waiter(proto)

    async def _keepalive(self, proto: Any) -> None:
        """The control connection idles while data moves elsewhere; pings keep it (and NATs) open."""
        while not proto.terminated:
            await asyncio.sleep(KEEPALIVE)
            with contextlib.suppress(Exception):
                proto._quic.send_ping(0)
                proto.transmit()

    def open_channel(self) -> Channel:
        async def _open() -> QuicChannel:
            sid = self.proto._quic.get_next_available_stream_id()
            ch = QuicChannel(self.proto, sid, self._lt.loop, self.opts.max_frame)
            self.proto.channels[sid] = ch
            return ch

        if self.proto.terminated:
            raise PeerUnreachableError(f"QUIC connection closed: {self.proto.terminated}")
        ch: QuicChannel = self._lt.run(_open(), timeout=5)
        return ch

    def close(self) -> None:
        if not self._lt.loop.is_running():
            self._lt.stop()
            for ch in list(self.proto.channels.values()):
                ch.fail(PeerUnreachableError("QUIC connection closed"))
            return

        async def _close() -> None:
            try:
                if self._pinger is not None:
                    self._pinger.cancel()
                self.proto.close()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.proto.wait_closed(), 1.0)
            finally:
                # the socket itself: closing the QUIC connection leaves it to the garbage collector
                self._transport.close()
                await asyncio.sleep(0)  # its connection_lost (which closes the fd) runs next turn

        try:
            with contextlib.suppress(Exception):
                self._lt.run(_close(), timeout=3)
        finally:
            # also on a KeyboardInterrupt in the wait above, which goes on up: the loop thread ends,
            # and a thread still reading one of the channels hears that the connection is gone
            try:
                self._lt.stop()
            finally:
                for ch in list(self.proto.channels.values()):
                    ch.fail(PeerUnreachableError("QUIC connection closed"))


def _why_unreachable(exc: BaseException, timeout: float) -> str:
    """One phrase for a failed QUIC connect. The libraries raise bare TimeoutError/ConnectionError,
    whose text is empty."""
    if str(exc):
        return str(exc)
    if isinstance(exc, TimeoutError):
        return f"no answer within {round(timeout, 1):g} s"
    if isinstance(exc, ConnectionError):
        return "the handshake did not complete (nothing listening, or it closed the connection)"
    return type(exc).__name__


def _der() -> Any:
    from cryptography.hazmat.primitives.serialization import Encoding

    return Encoding.DER


class QuicListener:
    def __init__(self, opts: ListenOptions, handler: Callable[[Channel], None]):
        self.opts = opts
        self.handler = handler
        self.backend = pick_backend(str(opts.extra.get("quic_backend", "auto")))
        wanted = opts.extra.get("datagram_size")
        self.datagram = min(int(wanted), self.backend.max_datagram) if wanted else self.backend.max_datagram
        caps = (
            int(opts.extra.get("max_unauthenticated", MAX_UNAUTHENTICATED)),
            int(opts.extra.get("max_unauthenticated_per_peer", MAX_UNAUTHENTICATED_PER_PEER)),
        )
        self._slots = PreAuthSlots(*caps)  # streams
        self._conn_slots = PreAuthSlots(*caps)  # connections none of whose streams authenticated
        self._handshakes = _Handshakes(self.backend)
        self._lt = _LoopThread("rq-quic-server")
        self._done = threading.Event()
        # the handler threads of streams still open, each with its channel: close() ends them
        self._live: dict[threading.Thread, QuicChannel] = {}
        self._live_lock = threading.Lock()
        self._closing = False
        self._sock: socket.socket | None = None
        try:
            self.server, self.address = self._lt.run(self._start(), timeout=10)
        except BaseException:
            self._lt.stop()
            raise

    async def _start(self) -> tuple[Any, tuple[str, int]]:
        import tempfile
        from pathlib import Path

        b, o = self.backend, self.opts
        cfg = _config(b, False, self.datagram)
        with tempfile.TemporaryDirectory() as tmp:
            cert, key = Path(tmp) / "c.pem", Path(tmp) / "k.pem"
            cert.write_bytes(o.identity.cert_pem)
            key.write_bytes(o.identity.key_pem)
            cfg.load_cert_chain(str(cert), str(key))
        loop = asyncio.get_running_loop()
        info = (await loop.getaddrinfo(o.host, o.port, type=socket.SOCK_DGRAM))[0]
        sock = socket.socket(info[0], socket.SOCK_DGRAM)
        _big_buffers(sock)
        sock.bind(info[4])
        burst = _Burst()
        proto_cls = _protocol_class(b, self._on_stream, burst, self._on_connected, self._handshakes)
        _, server = await loop.create_datagram_endpoint(
            lambda: b.server.QuicServer(configuration=cfg, create_protocol=proto_cls), sock=sock
        )
        self._handshakes.server = server
        _read_bursts(loop, sock, server, burst)
        self._sock = sock
        return server, sock.getsockname()[:2]

    def _on_connected(self, proto: Any) -> None:
        """On the loop, once a connection's handshake completed (its address validated): it takes
        an unauthenticated connection slot, or is closed at once where its address or the listener
        has none left; one that still has no authenticated stream PRE_AUTH_CONNECTION seconds
        later is closed (a stream's own handshake frames are bounded apart, by the receiver)."""
        release = self._conn_slots.acquire(proto.peer)
        if release is None:
            _close_untrusted(proto, "too many connections that have not authenticated")
            return
        proto.release_connection = release
        self._lt.loop.call_later(PRE_AUTH_CONNECTION, self._expire, proto)

    @staticmethod
    def _expire(proto: Any) -> None:
        if not proto.trusted and proto.terminated is None:
            _close_untrusted(proto, f"no stream authenticated within {PRE_AUTH_CONNECTION:g} s")

    def _on_stream(self, proto: Any, stream_id: int) -> QuicChannel:
        """On the loop, for a stream's first bytes: a channel whose handler runs in a thread of its
        own, holding one of the unauthenticated slots until the peer authenticated or it ends.
        Past the cap (or with no thread to be had) the stream is turned away; the channel stays
        registered so the rest of its bytes are dropped, not taken for a new stream."""
        o = self.opts
        release = self._slots.acquire(proto.peer)
        if release is None:
            ch = QuicChannel(proto, stream_id, self._lt.loop, o.max_frame, PRE_AUTH_LIMIT)
            ch.turn_away()
            return ch
        ch = QuicChannel(proto, stream_id, self._lt.loop, o.max_frame, PRE_AUTH_LIMIT, release)
        thread = threading.Thread(target=self._serve_one, args=(ch,), daemon=True)
        try:
            with self._live_lock:
                if self._closing:  # close() has taken its list: this one is not on it
                    raise RuntimeError("the listener is closing")
                self._live[thread] = ch
                thread.start()
        except RuntimeError:  # "can't start new thread"
            with self._live_lock:
                self._live.pop(thread, None)
            ch.release_slot()
            ch.turn_away()
        return ch

    def _serve_one(self, ch: QuicChannel) -> None:
        try:
            self.handler(ch)
        finally:
            ch.release_slot()
            with self._live_lock:
                self._live.pop(threading.current_thread(), None)

    def _end_handlers(self) -> None:
        """Ends the channels still open and waits for their handlers (never the calling thread's),
        while the loop still runs, so what they send last (an ERROR, the FIN) goes out: first their
        readers are woken (a reply being written is finished), then, after CLOSE_GRACE, the
        channels fail (a handler waiting for room to send stops), waited for up to CLOSE_LIMIT."""
        with self._live_lock:
            self._closing = True
            live = dict(self._live)
        me = threading.current_thread()
        for ch in live.values():
            ch.shutting_down = True
            ch.interrupt(PeerUnreachableError("the receiver is shutting down"))
        waiting = [t for t in live if t is not me]
        _join(waiting, CLOSE_GRACE)
        for thread, ch in live.items():
            if thread.is_alive():
                ch.fail(PeerUnreachableError("the receiver is shutting down"))
        _join(waiting, CLOSE_LIMIT)

    def serve_forever(self) -> None:
        self._done.wait()

    def close(self) -> None:
        if self._done.is_set():
            return
        if self._lt.loop.is_running():
            self._end_handlers()

        async def _close() -> None:
            with contextlib.suppress(Exception):
                self.server.close()
            await asyncio.sleep(0)  # the transport's connection_lost runs in the loop's next turn

        if self._lt.loop.is_running():
            with contextlib.suppress(Exception):
                self._lt.run(_close(), timeout=2)
        self._lt.stop()
        # The transport closes its socket in a callback of the loop's next turn, which a loop
        # stopped at once never takes: the port stayed bound for the life of the process.
        if self._sock is not None:
            self._sock.close()
        self._done.set()


def _close_untrusted(proto: Any, why: str) -> None:
    """On the loop: closes a connection that has not authenticated, and gives its slot back."""
    release, proto.release_connection = proto.release_connection, None
    if release is not None:
        release()
    with contextlib.suppress(Exception):
        proto._quic.close(error_code=CONNECTION_REFUSED, reason_phrase=why)
        proto.transmit()


def _join(threads: list[threading.Thread], within: float) -> None:
    deadline = time.monotonic() + within
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))


class QuicTransport:
    name = "quic"
    connection_per_process = True  # aioquic/qh3 spend ~50 µs of Python per packet: one core each

    def listen(self, opts: ListenOptions, handler: Callable[[Channel], None]) -> QuicListener:
        return QuicListener(opts, handler)

    def connect(self, opts: ConnectOptions) -> QuicConnection:
        return QuicConnection(opts)
