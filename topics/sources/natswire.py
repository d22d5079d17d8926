"""A small, read-only NATS wire client for the JetStream hot path: one ordered push consumer.

Why not nats-py here: nats-py spends ~5 µs of Python per message (protocol parser, a Msg object,
an asyncio queue, a coroutine per callback) — the ceiling FIELD-NOTES measured (~150k msg/s). This
reader parses MSG/HMSG frames straight out of a reusable receive buffer in batches, which is what
lets `rq replay nats://…` go faster than a plain nats-py consumer. Everything else (stream info,
durable consumers, publishing) still goes through nats-py.

Protocol used (https://docs.nats.io/reference/reference-protocols/nats-protocol):
  INFO/CONNECT/PING/PONG, SUB, UNSUB, PUB, MSG, HMSG, +OK, -ERR. JetStream API subjects:
  $JS.API.CONSUMER.CREATE.<stream> (ephemeral, ordered-consumer settings: ack none, max_deliver 1,
  flow control, idle heartbeat, memory storage) and $JS.API.CONSUMER.DELETE.<stream>.<name>.
Ordered-consumer rules: a gap in the consumer sequence means a lost message -> the consumer is
re-created from the last stream sequence seen + 1; flow-control requests and stalled heartbeats
are answered with an empty publish to the subject they name.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import ssl
import struct
import termios
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple

import orjson

from topics.errors import (
    AccessDenied,
    ConnectionLost,
    NoResponders,
    ProtocolViolation,
    SourceUnreachable,
    TopicError,
    TopicNotFound,
)
from topics.record import NO_HEADERS, Headers, Record
from topics.sources.access import Access, hostport, reason, tls_context, tls_hint

_CRLF = b"\r\n"
_RECV = 4 * 1024 * 1024


_ACCOUNT_INFO = "$JS.API.INFO"

# What rq buffers of what a server sends, at most. A protocol line (INFO, MSG/HMSG, -ERR, ...):
# nats-server writes them well under this, an INFO naming a large cluster's URLs included.
MAX_LINE = 1024 * 1024
SEND_STALL_S = 10.0  # nothing at all went out for this long: the server or the path is gone
# A frame's payload: the server's INFO max_payload (nats-server refuses to run with more than
# 64 MiB), plus room for what the server itself sends beyond a client's limit (JetStream API
# replies, e.g. a page of 256 consumers' info). Without a bound, a server (or whatever answers on
# its port) declaring `MSG x 1 100000000000` has rq buffer everything that follows.
_MAX_PAYLOAD_CEILING = 64 * 1024 * 1024
_DEFAULT_MAX_PAYLOAD = 1024 * 1024
_HEADROOM = 8 * 1024 * 1024
# A JetStream API reply (nats-py's connection: a message get among them) carries a stored message
# base64-encoded, and a stream keeps messages stored while the server's max_payload was higher:
# such a reply is bounded by base64 of the ceiling (4/3), plus the same headroom, not by the
# max_payload the server declares now.
_API_REPLY_LIMIT = _MAX_PAYLOAD_CEILING * 4 // 3 + _HEADROOM


def frame_limit(info: dict[str, Any], api: bool = False) -> int:
    """The largest MSG/HMSG payload rq takes from a server that sent this INFO (on a connection
    that carries only JetStream API replies when `api`)."""
    if api:
        return _API_REPLY_LIMIT
    declared = info.get("max_payload")
    payload = declared if isinstance(declared, int) and declared > 0 else _DEFAULT_MAX_PAYLOAD
    return min(payload, _MAX_PAYLOAD_CEILING) + _HEADROOM


def violation(where: str, what: str) -> ProtocolViolation:
    """One line for a server that broke the NATS protocol; rq closes the connection on it."""
    return ProtocolViolation(
        f"NATS at {where} broke the NATS protocol: {what}; rq closed the connection "
        "(is that port a NATS server's, or is something in between rewriting it?)"
    )


def too_large(where: str, size: int, info: dict[str, Any], api: bool = False) -> ProtocolViolation:
    if api:
        return violation(
            where,
            f"it sent a JetStream API reply of {size} bytes, more than rq takes from it "
            f"({frame_limit(info, api)} bytes: base64 of the largest message a NATS server stores, "
            f"max_payload {_MAX_PAYLOAD_CEILING} at most, plus room)",
        )
    return violation(
        where,
        f"it sent a message of {size} bytes, more than rq takes from it ({frame_limit(info)} bytes: "
        f"its max_payload {info.get('max_payload', 'not given')}, plus room for JetStream's replies; "
        "a message stored while its max_payload was higher is over it too)",
    )


def endless_line(where: str) -> ProtocolViolation:
    return violation(where, f"it sent a protocol line of more than {MAX_LINE} bytes with no end")


def header_past_total(where: str, frame: str) -> ProtocolViolation:
    return violation(where, f"a message whose header block is larger than the whole message ({frame})")


class WireError(TopicError):
    pass


def parse_info(line: bytes) -> dict[str, Any]:
    """The server's INFO line as a dict; anything else is not a NATS server."""
    meta: object = None
    if line.startswith(b"INFO "):
        with contextlib.suppress(orjson.JSONDecodeError):
            meta = orjson.loads(line[5:])
    if not isinstance(meta, dict):
        raise SourceUnreachable(f"not a NATS server (said {line[:40]!r})")
    return meta


def jetstream_silent(
    info: dict[str, Any], where: str, who: str, what: str, account: bool | None, said: str | None = None
) -> SourceUnreachable:
    """The line for a JetStream API request that got no answer but 503, worded by what is known:
    the server's INFO (`jetstream`: whether the server runs JetStream at all), whether the
    account's own JetStream info request (`$JS.API.INFO`) is answered (`account`; None: not
    known), and the server's own description of a 503 when it gave one (`said`, e.g. 'JetStream
    system temporarily unavailable' while a cluster elects a leader)."""
    if said and "not enabled" in said.lower():
        # err_codes 10039 (for the account) and 10076 (on the server): the server says so itself
        return NoResponders(
            f"NATS at {where} answered {what}: {said} (connected {who}): enable JetStream for that "
            "account or server, or connect as a user of an account that has it"
        )
    if said:
        return SourceUnreachable(
            f"NATS at {where}: JetStream is unavailable for {what}: {said}; try again later"
        )
    if info.get("jetstream") is False or ("jetstream" not in info and account is False):
        return NoResponders(
            f"JetStream is not enabled on the NATS server at {where} (nothing answered {what}): "
            "start it with JetStream (nats-server -js)"
        )
    if account is False:
        return NoResponders(
            f"JetStream runs on the NATS server at {where} but does not answer rq's account "
            f"(connected {who}): JetStream is not enabled for that account, or its streams are in "
            "another JetStream domain"
        )
    if account:
        return NoResponders(
            f"NATS at {where}: JetStream answers rq's account but nothing answered {what}: the "
            "stream's leader may be unavailable or not yet elected (a cluster); try again later"
        )
    return NoResponders(
        f"nothing answered {what} at NATS {where}: JetStream is not enabled on the server or for "
        f"rq's account (connected {who})"
    )


def connect_auth(access: Access) -> dict[str, str]:
    """CONNECT's credential fields (protocol reference: user/pass, or auth_token)."""
    if access.user is None:
        return {}
    if access.password is None:
        return {"auth_token": access.user}
    return {"user": access.user, "pass": access.password}


def refuse_plain(where: str) -> str:
    return (
        f"NATS at {where} does not require TLS, and TLS was asked for (tls:// or NATS_CA/NATS_CERT): "
        "refusing to talk to it in the clear"
    )


def client_certificate_refused(exc: ssl.SSLError) -> bool:
    """The server's TLS alert says it wants a (different) client certificate."""
    return any(
        name in str(exc.reason or exc)
        for name in ("CERTIFICATE_REQUIRED", "ALERT_UNKNOWN_CA", "ALERT_BAD_CERTIFICATE")
    )


def no_client_certificate(where: str) -> AccessDenied:
    """The server's INFO asks for a client certificate (tls_verify) and rq has none."""
    return AccessDenied(
        f"NATS at {where} requires a client certificate: set NATS_CERT and NATS_KEY", credentials=False
    )


def client_certificate_rejected(where: str, exc: ssl.SSLError) -> AccessDenied:
    return AccessDenied(
        f"NATS at {where} refused rq's client certificate ({exc.reason}): check NATS_CERT and NATS_KEY",
        credentials=False,
    )


def closed_after_client_certificate(where: str) -> AccessDenied:
    """A server that wants a client certificate, took ours through the handshake and then cut the
    connection: with TLS 1.3 it checks the certificate after the client's side is done, and its
    alert is lost when the reset comes first (which one the client sees is a race)."""
    return AccessDenied(
        f"NATS at {where} requires a client certificate and closed the connection once it had rq's: "
        "it most likely refused it; check NATS_CERT and NATS_KEY",
        credentials=False,
    )


def certificate_refused(where: str, exc: ssl.SSLCertVerificationError) -> str:
    return f"NATS at {where}: the server's certificate was refused ({exc.verify_message}); {tls_hint(exc, 'NATS_CA')}"


def _size(field: bytes, line: bytes, where: str) -> int:
    """A frame's byte count, checked: a server's garbage is a ProtocolViolation, not a ValueError."""
    if not field.isdigit():
        raise violation(where, f"a malformed frame ({line[:80]!r})")
    return int(field)


def _parse_headers(block: bytes) -> tuple[str, Headers]:
    """'NATS/1.0 100 Idle Heartbeat\\r\\nK: V\\r\\n\\r\\n' -> ('100 Idle Heartbeat', ((k, v), ...))."""
    lines = block.split(_CRLF)
    status = (
        lines[0][8:].strip().decode("utf-8", "replace") if lines and lines[0].startswith(b"NATS/1.0") else ""
    )
    out = []
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(b":")
        if sep:
            out.append((name.strip().decode("utf-8", "replace"), value.strip()))
    return status, tuple(out)


class _Wire:
    """One NATS connection of rq's own: handshake (TLS, credentials), sending, and MSG/HMSG frames
    parsed in batches out of one reusable receive buffer."""

    def __init__(self, host: str, port: int, access: Access | None = None, timeout: float = 5.0):
        self.host = host
        self.access = access or Access()
        self.timeout = timeout
        self.info: dict[str, Any] = {}
        try:
            self.sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as exc:
            raise SourceUnreachable(f"cannot reach NATS at {host}:{port}: {reason(exc)}") from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with contextlib.suppress(OSError):
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 * 1024 * 1024)
        self.where = hostport(host, port)
        self.buf = bytearray(_RECV)
        self.view = memoryview(self.buf)
        self.start = 0  # unparsed bytes are buf[start:end]
        self.end = 0
        self.limit = frame_limit({})  # the server's own, once its INFO is in
        self.token = os.urandom(8).hex()
        self.pongs = 0  # PONGs seen after the handshake: answers to a liveness PING
        try:
            self._handshake()
        except BaseException:
            self.sock.close()
            raise

    # -- connection -----------------------------------------------------------------------------

    def _send(self, data: bytes) -> None:
        """Sends all of `data`, giving up only when nothing goes out for SEND_STALL_S. sendall()
        under a socket timeout bounds the whole call (the timeout _fill last set): a 1 MiB batch
        on a link under ~100 KB/s was a lost connection though it was moving (np2)."""
        view = memoryview(data)
        self.sock.settimeout(SEND_STALL_S)
        try:
            while view:
                view = view[self.sock.send(view) :]
        except TimeoutError:
            raise ConnectionLost(
                f"lost the NATS server at {self.where}: nothing could be sent to it for {SEND_STALL_S:g} s"
            ) from None
        except OSError as exc:
            raise ConnectionLost(f"lost the connection to NATS at {self.where}: {reason(exc)}") from None

    def _queued(self) -> int | None:
        """Bytes sent that the server's side has not yet acknowledged (TIOCOUTQ); None if unknown."""
        try:
            return int(struct.unpack("i", fcntl.ioctl(self.sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0])
        except (OSError, ValueError):
            return None

    def _fill(self, timeout: float | None) -> bool:
        """Reads more bytes; False on timeout. Compacts the buffer so it is reused, never regrown
        unless one frame is larger than it."""
        if self.start == self.end:
            self.start = self.end = 0
        elif self.start > len(self.buf) // 2 or self.end == len(self.buf):
            n = self.end - self.start
            self.buf[:n] = self.buf[self.start : self.end]
            self.start, self.end = 0, n
        if self.end == len(self.buf):  # a frame bigger than the buffer: grow, up to the bound
            if self.buf.find(_CRLF, self.start, self.end) < 0 and self.end - self.start > MAX_LINE:
                raise endless_line(self.where)
            most = self.limit + MAX_LINE + 2  # a frame's line, its payload and CRLF: _frames checks
            if len(self.buf) >= most:
                raise violation(self.where, f"it sent more than {most} bytes without completing a frame")
            self.view.release()  # a bytearray with a live export cannot be resized
            self.buf.extend(bytes(min(len(self.buf), most - len(self.buf))))
            self.view = memoryview(self.buf)
        self.sock.settimeout(timeout)
        try:
            n = self.sock.recv_into(self.view[self.end :])
        except TimeoutError:
            return False
        except OSError as exc:
            raise ConnectionLost(f"lost the connection to NATS at {self.where}: {reason(exc)}") from None
        if n == 0:
            raise ConnectionLost(f"the NATS server at {self.where} closed the connection")
        self.end += n
        return True

    def _line(self) -> bytes:
        """One protocol line (blocking), for the handshake."""
        deadline = time.monotonic() + self.timeout
        while True:
            i = self.buf.find(_CRLF, self.start, self.end)
            if i >= 0:
                line = bytes(self.buf[self.start : i])
                self.start = i + 2
                return line
            if not self._fill(max(deadline - time.monotonic(), 0.01)) and time.monotonic() > deadline:
                raise SourceUnreachable("the NATS server did not answer")

    def _handshake(self) -> None:
        info = self._line()
        meta = self.info = parse_info(info)
        self.limit = frame_limit(meta)
        if self.access.tls and not meta.get("tls_required"):
            raise ConnectionLost(refuse_plain(self.where))
        if meta.get("tls_verify") and self.access.cert is None:
            raise no_client_certificate(self.where)
        if meta.get("tls_required"):
            self._start_tls()
        if not meta.get("headers", False):
            raise WireError("this NATS server does not support headers (needs nats-server >= 2.2)")
        connect: dict[str, object] = {
            "verbose": False,
            "pedantic": False,
            "headers": True,
            "no_responders": True,
            "lang": "rq",
            "version": "1",
            "protocol": 1,
            "tls_required": bool(meta.get("tls_required")),
            **connect_auth(self.access),
        }
        try:
            self._send(b"CONNECT " + orjson.dumps(connect) + b"\r\nPING\r\n")
            line = self._line()
        except SourceUnreachable:
            if meta.get("tls_verify") and self.access.cert is not None:
                raise closed_after_client_certificate(self.where) from None
            raise
        while True:
            if line == b"PONG":
                break
            if line.startswith(b"-ERR"):
                said = line.decode(errors="replace")
                if "authorization violation" in said.lower():
                    raise AccessDenied(f"NATS at {self.where} refused rq {self.access.who()}: {said}")
                raise SourceUnreachable(f"NATS refused the connection: {said}")
            line = self._line()

    def _start_tls(self) -> None:
        """The server asks for TLS after its INFO line; nothing else is in flight at this point."""
        ctx = tls_context(self.access) or ssl.create_default_context()
        try:
            self.sock = ctx.wrap_socket(self.sock, server_hostname=self.host)
        except ssl.SSLCertVerificationError as exc:
            raise AccessDenied(certificate_refused(self.where, exc), credentials=False) from None
        except ssl.SSLError as exc:
            if client_certificate_refused(exc):
                raise client_certificate_rejected(self.where, exc) from None
            raise SourceUnreachable(f"TLS with NATS at {self.where} failed: {reason(exc)}") from None
        except OSError as exc:
            raise SourceUnreachable(f"TLS with NATS at {self.where} failed: {reason(exc)}") from None

    # -- frames ---------------------------------------------------------------------------------

    def _frames(self) -> Iterator[tuple[bytes, bytes, bytes, bytes, bytes]]:
        """Complete MSG/HMSG frames in the buffer as (sid, subject, reply, headers, payload);
        answers PING on the way."""
        buf = self.buf
        find = buf.find
        while True:
            start = self.start
            i = find(_CRLF, start, self.end)
            if i < 0:
                return
            line = bytes(buf[start:i])
            if line.startswith(b"MSG "):
                parts = line.split(b" ")
                size = _size(parts[-1], line, self.where)
                if size > self.limit:
                    raise too_large(self.where, size, self.info)
                body = i + 2
                if body + size + 2 > self.end:
                    return
                reply = parts[3] if len(parts) == 5 else b""
                self.start = body + size + 2
                yield parts[2], parts[1], reply, b"", bytes(buf[body : body + size])
            elif line.startswith(b"HMSG "):
                parts = line.split(b" ")
                hsize, total = _size(parts[-2], line, self.where), _size(parts[-1], line, self.where)
                if total > self.limit:
                    raise too_large(self.where, total, self.info)
                if hsize > total:
                    raise header_past_total(self.where, repr(line[:80]))
                body = i + 2
                if body + total + 2 > self.end:
                    return
                reply = parts[3] if len(parts) == 6 else b""
                self.start = body + total + 2
                yield (
                    parts[2],
                    parts[1],
                    reply,
                    bytes(buf[body : body + hsize]),
                    bytes(buf[body + hsize : body + total]),
                )
            else:
                self.start = i + 2
                if line == b"PING":
                    self._send(b"PONG\r\n")
                elif line.startswith(b"-ERR"):
                    said = line.decode(errors="replace")
                    if "permissions violation" in said.lower():
                        raise AccessDenied(
                            f"NATS at {self.where} denied rq {self.access.who()}: {said}", credentials=False
                        )
                    # The server answered: it is reachable, and what it refused is rq's request,
                    # so this is a failure of the operation (exit 1), not an outage (exit 6).
                    raise TopicError(f"NATS at {self.where} answered rq's request with an error: {said}")
                elif line == b"PONG":
                    self.pongs += 1
                # +OK, INFO: nothing to do

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
        self.view.release()


# The consumer's idle heartbeat, asked of the server; after MISSED_HEARTBEATS of them with nothing
# heard on the connection, rq asks the server for a PONG (as nats-py's ordered consumer checks its
# heartbeats and resets the consumer): a server that answers gets its consumer re-created, one that
# does not answer within the connection's timeout is lost (SIGSTOPped, a dead link that TCP has
# not noticed yet, a proxy holding a half-open connection), not an idle stream to wait on forever.
HEARTBEAT_S = 5.0
MISSED_HEARTBEATS = 2


class OrderedReader(_Wire):
    """Reads a stream from a sequence with an ordered push consumer, yielding record batches."""

    idle_beats = 0  # idle heartbeats heard: the consumer had nothing to deliver for a while

    def __init__(
        self,
        host: str,
        port: int,
        stream: str,
        subject: str,
        access: Access | None = None,
        timeout: float = 5.0,
    ):
        super().__init__(host, port, access, timeout)
        self.stream = stream
        self.subject = subject
        self.api_inbox = f"_INBOX.rq.{self.token}.api"
        self.sid = b"0"  # the deliver subscription; a new one per consumer so old pushes are ignored
        self.sids = 2
        self.consumer: str | None = None
        self._early: list[tuple[bytes, bytes, bytes, bytes, bytes]] = []
        self.next_dseq = 1
        self.last_sseq = 0
        self.pending_left = -1
        self._send(f"SUB {self.api_inbox} 2\r\n".encode())

    # -- the JetStream API ----------------------------------------------------------------------

    def _silent(self, subject: str) -> SourceUnreachable:
        account: bool | None = None
        if subject != _ACCOUNT_INFO:
            try:
                self._api(_ACCOUNT_INFO, {})
                account = True
            except NoResponders:
                account = False
            except TopicError:
                account = None
        return jetstream_silent(self.info, self.where, self.access.who(), subject, account)

    def _api(self, subject: str, body: dict[str, object]) -> dict[str, object]:
        payload = orjson.dumps(body)
        self._send(f"PUB {subject} {self.api_inbox} {len(payload)}\r\n".encode() + payload + _CRLF)
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            for sid, _subj, _reply, hdr, data in self._frames():
                if sid == b"2":
                    if hdr and b" 503" in hdr[:16]:
                        raise self._silent(subject)
                    try:
                        resp = orjson.loads(data)
                    except orjson.JSONDecodeError:
                        resp = None
                    if not isinstance(resp, dict):
                        raise violation(
                            self.where, f"a reply to {subject} that is no JSON object: {data[:80]!r}"
                        )
                    err = resp.get("error")
                    if isinstance(err, dict):
                        if err.get("code") == 404:
                            raise TopicNotFound(f"JetStream stream {self.stream} does not exist")
                        raise WireError(f"JetStream said: {err.get('description', err)}")
                    return resp
                if sid == self.sid:  # pushed before the API reply came: keep it for the reader
                    self._early.append((sid, _subj, _reply, hdr, data))
            self._fill(0.05)
        raise ConnectionLost(f"JetStream did not answer {subject}")

    def create(self, start_seq: int) -> int:
        """(Re)creates the ephemeral ordered consumer at start_seq; returns messages it will deliver."""
        self._early = []
        if self.consumer is not None:
            self.delete()
            self._send(b"UNSUB " + self.sid + _CRLF)
        self.sids += 1
        self.sid = str(self.sids).encode()
        deliver = f"_INBOX.rq.{self.token}.d{self.sids}"
        self._send(f"SUB {deliver} {self.sids}\r\n".encode())
        config: dict[str, object] = {
            "deliver_subject": deliver,
            "deliver_policy": "by_start_sequence",
            "opt_start_seq": max(start_seq, 1),
            "ack_policy": "none",
            "max_deliver": 1,
            "flow_control": True,
            "idle_heartbeat": int(HEARTBEAT_S * 1e9),
            "mem_storage": True,
            "num_replicas": 1,
            "inactive_threshold": 30_000_000_000,  # the server cleans up after us if we die
        }
        if self.subject:
            config["filter_subject"] = self.subject
        info = self._api(
            f"$JS.API.CONSUMER.CREATE.{self.stream}", {"stream_name": self.stream, "config": config}
        )
        self.consumer = str(info.get("name"))
        self.next_dseq = 1
        delivered = info.get("delivered")
        pushed = delivered.get("consumer_seq", 0) if isinstance(delivered, dict) else 0
        pending = info.get("num_pending", 0)
        # Not yet delivered plus already pushed to us (the server may send before it replies).
        return (pending if isinstance(pending, int) else 0) + (pushed if isinstance(pushed, int) else 0)

    def delete(self) -> None:
        if self.consumer is None:
            return
        name, self.consumer = self.consumer, None
        payload = b""
        with contextlib.suppress(OSError):
            self.sock.sendall(
                f"PUB $JS.API.CONSUMER.DELETE.{self.stream}.{name} 0\r\n".encode() + payload + _CRLF
            )

    def batches(
        self, start_seq: int, stop: int | None, follow: bool, idle_timeout: float | None
    ) -> Iterator[list[Record]]:
        total = self.create(start_seq)
        self.last_sseq = max(start_seq, 1) - 1  # a consumer re-created before any record starts here
        if total == 0 and not follow:
            return
        idle_since = heard = time.monotonic()
        ping: _Ping | None = None
        beats = self.idle_beats
        while True:
            early, self._early = self._early, []
            batch, restart = self._take(early) if early else ([], False)
            if not restart:
                more, restart = self._take(self._frames())
                batch += more
            if restart:
                # A lost message: like nats-py's ordered consumer, start over after the last seen.
                self.create(self.last_sseq + 1)
            if batch:
                idle_since = time.monotonic()
                if stop is not None and batch[-1][0] >= stop:
                    batch = [r for r in batch if r[0] < stop]
                    if batch:
                        yield batch
                    return
                yield batch
                if stop is not None and self.last_sseq >= stop - 1:
                    return
            if not follow and self.pending_left == 0:
                return
            if (not follow or stop is not None) and self.idle_beats != beats:
                # The consumer idles although the last message said more were pending: the rest
                # of the range was purged or expired (max_age) while the read was behind. The
                # caller tells the gap up to `stop` once the read ends (as with a purge keep=N).
                # A follow bounded by `stop` ends the same way once the stream has stored past
                # its range: what is missing from it will never come.
                beats = self.idle_beats
                whole = not follow or (stop is not None and self._stored_upto() >= stop - 1)
                if whole and self._drained():
                    return
            # A PONG is counted as _frames() parses the buffer (above), not when _fill() reads it:
            # checked here, it is seen even when nothing comes after it (a consumer gone quiet
            # sends nothing more), not only once some later frame wakes the loop.
            if ping is not None and self.pongs != ping.pongs:
                answered, ping = ping, None  # the server answered: alive
                if answered.deaf:  # but the consumer went quiet: start it again where the read is
                    self.create(self.last_sseq + 1)
                    heard = time.monotonic()
                elif idle_timeout is not None and time.monotonic() - idle_since > idle_timeout:
                    # A live server; but a silence because the consumer (or its stream) was
                    # deleted is no idle stream: re-created (a stream gone is TopicNotFound).
                    if self._consumer_there():
                        return  # a real silence on a live server: --timeout ends the follow
                    self.create(self.last_sseq + 1)
                    idle_since = heard = time.monotonic()
                continue
            if restart or self._early:
                continue
            if self._fill(0.05):
                heard = time.monotonic()
                continue
            now = time.monotonic()
            quiet = follow and idle_timeout is not None and now - idle_since > idle_timeout
            deaf = now - heard > HEARTBEAT_S * MISSED_HEARTBEATS
            if ping is None and (quiet or deaf):
                self._send(b"PING\r\n")
                ping = _Ping(now, self.pongs, deaf)
            elif ping is not None and now - ping.sent > self.timeout:
                raise self._gone(now - heard)
            if follow:
                yield []  # nothing yet: the caller may stop on the clock (--to @t -f)

    def _consumer_there(self) -> bool:
        if self.consumer is None:
            return False
        try:
            self._api(f"$JS.API.CONSUMER.INFO.{self.stream}.{self.consumer}", {})
        except TopicNotFound:  # the consumer's 404 (or its stream's)
            return False
        return True

    def _stored_upto(self) -> int:
        """The stream's last sequence now (0 when the reply does not say)."""
        info = self._api(f"$JS.API.STREAM.INFO.{self.stream}", {})
        state = info.get("state")
        last = state.get("last_seq") if isinstance(state, dict) else None
        return last if isinstance(last, int) else 0

    def _drained(self) -> bool:
        """True when the consumer has nothing left to deliver and all it delivered has come."""
        if self.consumer is None:
            return False
        info = self._api(f"$JS.API.CONSUMER.INFO.{self.stream}.{self.consumer}", {})
        pending = info.get("num_pending")
        delivered = info.get("delivered")
        sent = delivered.get("consumer_seq") if isinstance(delivered, dict) else None
        return pending == 0 and sent == self.next_dseq - 1 and not self._early

    def _gone(self, silent: float) -> SourceUnreachable:
        return ConnectionLost(
            f"lost the NATS server at {self.where}: nothing from it for {silent:.0f} s (its consumer "
            f"heartbeat is every {HEARTBEAT_S:g} s) and no answer to a PING within {self.timeout:g} s; "
            "the server is stalled or the network to it is down"
        )

    def _take(self, frames: Iterable[tuple[bytes, bytes, bytes, bytes, bytes]]) -> tuple[list[Record], bool]:
        """Records from deliver frames; True as well when a consumer sequence was skipped."""
        batch: list[Record] = []
        append = batch.append
        my_sid = self.sid
        for sid, subject, reply, hdr, data in frames:
            if sid != my_sid:
                continue
            if not reply.startswith(b"$JS.ACK."):
                self._control(reply, hdr)
                continue
            t = reply.split(b".")
            i = 5 if len(t) == 9 else 7
            try:
                dseq = int(t[i + 1])
                seq, ts, pending = int(t[i]), int(t[i + 2]) // 1_000_000, int(t[i + 3])
            except (ValueError, IndexError):
                raise violation(self.where, f"a malformed JetStream delivery ({reply[:80]!r})") from None
            if dseq != self.next_dseq:
                return batch, True
            self.next_dseq = dseq + 1
            self.last_sseq = seq
            self.pending_left = pending
            append((seq, ts, subject, _parse_headers(hdr)[1] if hdr else NO_HEADERS, data))
        return batch, False

    def _control(self, reply: bytes, hdr: bytes) -> None:
        """Flow control and heartbeats (status 100): answer what asks for an answer."""
        status, headers = _parse_headers(hdr) if hdr else ("", NO_HEADERS)
        if not status.startswith("100"):
            return
        if "Idle" in status:
            self.idle_beats += 1
        if "FlowControl" in status and reply:
            self._send(b"PUB " + reply + b" 0\r\n\r\n")
            return
        for name, value in headers:
            if name.lower() == "nats-consumer-stalled" and value:
                self._send(b"PUB " + value + b" 0\r\n\r\n")

    def close(self) -> None:
        self.delete()
        super().close()


class _Ping(NamedTuple):
    """A liveness PING awaiting its PONG: when it went out, the PONG count then, and whether the
    consumer's heartbeats had stopped (else it checks a silence before --timeout ends a follow)."""

    sent: float
    pongs: int
    deaf: bool


# What one send of a publisher's window holds at most, in bytes: big records are not all joined
# into one buffer.
_SEND_BYTES = 1 << 20


class Publisher(_Wire):
    """Publishes to JetStream, every message asking for the server's answer (its PubAck) on an
    inbox of its own; pipelined: up to `window` messages await their answer while more go out, in
    sends of up to _SEND_BYTES. All messages go out on this one connection, so the stream stores
    them in the order given.

    Why not nats-py: its answer path (protocol parser, a Msg object, an asyncio queue, a callback
    task per message) costs more than the publishing; here the answers are parsed in batches."""

    def __init__(self, host: str, port: int, access: Access | None = None, timeout: float = 5.0):
        super().__init__(host, port, access, timeout)
        self.inbox = f"_INBOX.rq.{self.token}.p.".encode()
        self._last_queued: int | None = None  # the send queue at the last look (_draining)
        self._send(b"SUB " + self.inbox + b"* 1\r\n")
        self.max_payload = int(self.info.get("max_payload") or 0)

    def _draining(self) -> bool:
        """Whether what was sent is still on its way out (the send queue shrank since the last
        look): on a slow link the answers wait for the records to arrive, which is not silence."""
        queued, before = self._queued(), self._last_queued
        self._last_queued = queued
        return queued is not None and before is not None and queued < before

    def publish(
        self,
        subject: str,
        messages: Sequence[tuple[bytes, bytes]],
        on_answer: Callable[[int, bytes, bytes], bool],
        window: int,
        answer_timeout: float,
    ) -> int:
        """Publishes `messages` ((header block or b"", value), in order) to `subject`; calls
        `on_answer(index, header block, data)` for each answer, which returns True to stop the
        publishing (a refusal). Returns how many went out, every one of them answered."""
        head, inbox, skip = subject.encode(), self.inbox, len(self.inbox)
        total, sent, answered, stop = len(messages), 0, 0, False
        while sent < total and not stop:
            chunk: list[bytes] = []
            size = 0
            end = min(total, answered + window)
            while sent < end and size < _SEND_BYTES:
                hdr, value = messages[sent]
                if hdr:
                    chunk.append(
                        b"HPUB %s %s%d %d %d\r\n" % (head, inbox, sent, len(hdr), len(hdr) + len(value))
                    )
                    chunk.append(hdr)
                else:
                    chunk.append(b"PUB %s %s%d %d\r\n" % (head, inbox, sent, len(value)))
                chunk.append(value)
                chunk.append(_CRLF)
                size += len(hdr) + len(value) + 40
                sent += 1
            self._send(b"".join(chunk))
            self._last_queued = self._queued()
            if sent - answered < window and sent < total:
                continue  # room in the window: the answers are read once it is full
            # a full window: read until half of it is answered (all at the end, or once stopped)
            until = sent if sent == total else sent - window // 2
            while answered < until or (stop and answered < sent):
                for sid, subj, _reply, hdr, data in self._frames():
                    if sid != b"1":
                        continue
                    index = subj[skip:]
                    if not index.isdigit():
                        raise WireError(f"an answer on an unexpected subject: {subj[:80]!r}")
                    stop = on_answer(int(index), hdr, data) or stop
                    answered += 1
                if answered >= until and not (stop and answered < sent):
                    break
                if not self._fill(answer_timeout) and not self._draining():
                    raise ConnectionLost(
                        f"no answer from the NATS server at {self.where} for {sent - answered} "
                        f"published record(s) within {answer_timeout:g} s; the server is stalled or "
                        "the network to it is down"
                    )
        return sent
