"""Small hostile servers for the topics tests: a NATS server and an MQTT broker that break the
protocol on purpose (a frame declaring 100 GB, a line that never ends, a header larger than its
message, a reply rq cannot read). Only for what a real server would never do; what a feature does
is proven against the real servers.

Each server listens on an ephemeral loopback port, answers in a thread per connection, and counts
the bytes it pushed before the client went away (`pushed`): a client that buffers without a bound
takes them all, one that refuses the frame closes the connection after a few socket buffers."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import orjson
from rqtest import recv_exactly, serving

INFO = {
    "server_id": "HOSTILE",
    "version": "2.10.0",
    "proto": 1,
    "headers": True,
    "max_payload": 1048576,
    "jetstream": True,
}

# How long a hostile server keeps pushing bytes at most: long enough for an unbounded client to
# take gigabytes, bounded so a test ends whatever the client does.
PUSH_FOR = 20.0
_BLOCK = b"\0" * 65536


def stream_info(name: str, messages: int = 0) -> bytes:
    """A valid $JS.API.STREAM.INFO reply for stream `name` (subjects NAME.>)."""
    return orjson.dumps(
        {
            "type": "io.nats.jetstream.api.v1.stream_info_response",
            "config": {
                "name": name,
                "subjects": [f"{name}.>"],
                "retention": "limits",
                "storage": "file",
                "max_consumers": -1,
                "max_msgs": -1,
                "max_bytes": -1,
                "max_age": 0,
                "num_replicas": 1,
                "discard": "old",
            },
            "created": "2026-01-01T00:00:00Z",
            "state": {
                "messages": messages,
                "bytes": 0,
                "first_seq": 1 if messages else 0,
                "last_seq": messages,
                "consumer_count": 0,
            },
        }
    )


@dataclass
class Hostile:
    port: int
    pushed: list[int] = field(default_factory=list)  # bytes pushed per hostile answer


def push(conn: socket.socket, first: bytes, seen: Hostile) -> None:
    """Sends `first`, then zero bytes until the client goes away or PUSH_FOR passes."""
    sent = 0
    end = time.monotonic() + PUSH_FOR
    try:
        conn.sendall(first)
        sent += len(first)
        while time.monotonic() < end:
            conn.sendall(_BLOCK)
            sent += len(_BLOCK)
    except OSError:
        pass
    seen.pushed.append(sent)


# answer(conn, subject, reply, sid, seen) -> True when the connection is done
NatsAnswer = Callable[[socket.socket, str, bytes, bytes, Hostile], bool]


@contextlib.contextmanager
def fake_nats(answer: NatsAnswer, info: dict[str, object] | None = None) -> Iterator[Hostile]:
    """A NATS server that greets like a real one (INFO, PONG to PING, +OK nothing) and hands every
    request (PUB/HPUB with a reply) to `answer`, with the sid of the client's last SUB."""
    seen = Hostile(0)

    def serve(conn: socket.socket, done: threading.Event) -> None:
        with contextlib.suppress(OSError), conn:
            conn.sendall(b"INFO " + orjson.dumps(info or INFO) + b"\r\n")
            f = conn.makefile("rb")
            sid = b"1"
            while not done.is_set():
                line = f.readline()
                if not line:
                    return
                parts = line.split()
                if not parts:
                    continue
                if parts[0] == b"PING":
                    conn.sendall(b"PONG\r\n")
                elif parts[0] == b"SUB":
                    sid = parts[-1]
                elif parts[0] in (b"PUB", b"HPUB"):
                    f.read(int(parts[-1]) + 2)
                    has_reply = len(parts) >= (4 if parts[0] == b"PUB" else 5)
                    if has_reply and answer(conn, parts[1].decode(), parts[2], sid, seen):
                        return

    with serving(serve) as port:
        seen.port = port
        yield seen


def msg(reply: bytes, sid: bytes, payload: bytes) -> bytes:
    return b"MSG %s %s %d\r\n%s\r\n" % (reply, sid, len(payload), payload)


def remaining_length(n: int) -> bytes:
    """MQTT's variable byte integer."""
    out = bytearray()
    while True:
        b, n = n % 128, n // 128
        out.append(b | (128 if n else 0))
        if not n:
            return bytes(out)


def _mqtt_packet(conn: socket.socket) -> tuple[int, bytes]:
    head = conn.recv(1)
    if not head:
        raise EOFError
    n, mult = 0, 1
    while True:
        b = conn.recv(1)[0]
        n += (b & 127) * mult
        mult *= 128
        if not b & 128:
            break
    return head[0], recv_exactly(conn, n)


@contextlib.contextmanager
def fake_mqtt(declared: int) -> Iterator[Hostile]:
    """An MQTT broker that takes the CONNECT and SUBSCRIBE, then sends a PUBLISH on sensors/a
    declaring `declared` bytes and pushes zero bytes after it (MQTT 3.1.1, or 5 when asked)."""
    seen = Hostile(0)

    def serve(conn: socket.socket, done: threading.Event) -> None:
        with contextlib.suppress(OSError, EOFError, IndexError), conn:
            _, body = _mqtt_packet(conn)
            v5 = len(body) > 6 and body[6] == 5
            conn.sendall(b"\x20\x03\x00\x00\x00" if v5 else b"\x20\x02\x00\x00")
            _, sub = _mqtt_packet(conn)
            conn.sendall(b"\x90" + (b"\x04" + sub[:2] + b"\x00\x00" if v5 else b"\x03" + sub[:2] + b"\x00"))
            topic = b"sensors/a"
            head = b"\x30" + remaining_length(declared) + struct.pack("!H", len(topic)) + topic
            push(conn, head + (b"\x00" if v5 else b""), seen)

    with serving(serve) as port:
        seen.port = port
        yield seen
