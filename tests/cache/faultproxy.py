"""A small HTTP/1.1 fault-injecting reverse proxy for S3 tests (used in front of real SeaweedFS).

Per request it may answer 503 SlowDown itself, or reset the connection mid-response; otherwise it
forwards the request and streams the response back (optionally rate-limited, to make a preload slow
enough to kill at a chosen moment). `stop()` closes the listener and every connection, which to the
client looks like the S3 server going away. Given an SSL context it speaks TLS to its clients (a
store behind a private CA). Test-only code: no fakes of S3 itself, only faults.
"""

from __future__ import annotations

import asyncio
import random
import socket
import ssl
import struct
import threading
import time
from dataclasses import dataclass, field

SLOWDOWN = (
    b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nContent-Length: %d\r\n"
    b"Connection: close\r\n\r\n%s"
)
NO_SUCH_KEY = b"HTTP/1.1 404 Not Found\r\nContent-Type: application/xml\r\nContent-Length: %d\r\n\r\n%s"
NO_SUCH_KEY_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>NoSuchKey</Code>'
    b"<Message>The specified key does not exist.</Message></Error>"
)
INTERNAL_ERROR = (
    b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/xml\r\nContent-Length: %d\r\n"
    b"Connection: close\r\n\r\n%s"
)
INTERNAL_ERROR_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>InternalError</Code>'
    b"<Message>We encountered an internal error. Please try again.</Message></Error>"
)
SLOWDOWN_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


@dataclass
class Stats:
    requests: int = 0
    slowdowns: int = 0
    resets: int = 0
    forwarded: int = 0
    paths: list[str] = field(default_factory=list)  # the path of each GET (/bucket/key), in order
    ranges: list[str] = field(default_factory=list)  # the Range header of each GET that had one
    connections: int = 0
    cuts: int = 0


class FaultProxy:
    def __init__(
        self,
        upstream_port: int,
        p_slowdown: float = 0.0,
        p_reset: float = 0.0,
        p_cut: float = 0.0,
        rate_bytes_per_s: float | None = None,
        seed: int = 1,
        only_get: bool = True,
        only_ranges: bool = False,
        only_objects: bool = False,
        missing: tuple[str, ...] = (),
        storm_s: float = 0.0,
        tls: ssl.SSLContext | None = None,
        internal_error: bool = False,
    ):
        self.upstream_port = upstream_port
        self.tls = tls  # answer over TLS with this context (a store behind a private CA)
        self.p_slowdown, self.p_reset = p_slowdown, p_reset
        self.internal_error = internal_error  # p_slowdown's answers are 500 InternalError instead
        self.p_cut = p_cut  # close cleanly (FIN) mid-body at an unaligned byte: a short response
        self.rate = rate_bytes_per_s
        self.only_get = only_get
        self.only_ranges = only_ranges  # fault only GETs with a Range header (big objects' pieces)
        self.only_objects = only_objects  # fault only requests for an object (not listings)
        self.missing = missing  # GETs of paths ending with these answer 404 NoSuchKey
        # a throttling storm: every faultable GET of an object answers SlowDown for this long after
        # the first one (how a hot partition behaves), long enough to outlast the client's retries
        self.storm_s = storm_s
        self._storm_until: float | None = None
        self.rng = random.Random(seed)
        self.stats = Stats()
        self.loop = asyncio.new_event_loop()
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.base_events.Server | None = None
        started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(started,), daemon=True)
        self._thread.start()
        assert started.wait(30), "the proxy's event loop did not start"

    @property
    def endpoint(self) -> str:
        if self.tls is not None:
            return f"https://localhost:{self.port}"  # the name its certificate carries
        return f"http://127.0.0.1:{self.port}"

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self._server = self.loop.run_until_complete(
            asyncio.start_server(self._client, "127.0.0.1", 0, ssl=self.tls)
        )
        self.port = self._server.sockets[0].getsockname()[1]
        started.set()
        self.loop.run_forever()

    def stop(self) -> None:
        """The server goes away: no listener, every open connection reset."""

        async def shutdown() -> None:
            assert self._server is not None
            self._server.close()
            for w in list(self._writers):
                _reset(w)
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self.loop.is_running():
            asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(10)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            self.loop.close()

    def _in_storm(self) -> bool:
        if not self.storm_s:
            return False
        now = time.monotonic()
        if self._storm_until is None:
            self._storm_until = now + self.storm_s
        return now < self._storm_until

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        self.stats.connections += 1
        up_r: asyncio.StreamReader | None = None
        up_w: asyncio.StreamWriter | None = None
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                method = head.split(b" ", 1)[0]
                self.stats.requests += 1
                body = await reader.readexactly(_content_length(head)) if _content_length(head) else b""
                path = head.split(b" ", 2)[1].split(b"?", 1)[0].decode()
                ranged = _header(head, b"range")[:1]
                self.stats.ranges.extend(ranged)
                if method == b"GET":
                    self.stats.paths.append(path)
                is_object = "/" in path.strip("/")  # path-style: /bucket/key
                faultable = (
                    (method == b"GET" or not self.only_get)
                    and (bool(ranged) or not self.only_ranges)
                    and (is_object or not self.only_objects)
                )
                if method == b"GET" and any(path.endswith(m) for m in self.missing):
                    writer.write(NO_SUCH_KEY % (len(NO_SUCH_KEY_BODY), NO_SUCH_KEY_BODY))
                    await writer.drain()
                    continue
                roll = self.rng.random()
                storm = faultable and is_object and self._in_storm()  # objects, not listings
                if faultable and (roll < self.p_slowdown or storm):
                    self.stats.slowdowns += 1
                    if self.internal_error:
                        writer.write(INTERNAL_ERROR % (len(INTERNAL_ERROR_BODY), INTERNAL_ERROR_BODY))
                    else:
                        writer.write(SLOWDOWN % (len(SLOWDOWN_BODY), SLOWDOWN_BODY))
                    await writer.drain()
                    writer.close()
                    return
                reset_midway = faultable and roll < self.p_slowdown + self.p_reset
                cut_midway = (
                    faultable and not reset_midway and roll < self.p_slowdown + self.p_reset + self.p_cut
                )
                if up_w is None:
                    up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
                assert up_r is not None
                up_w.write(head + body)
                await up_w.drain()
                self.stats.forwarded += 1
                await self._relay_response(up_r, writer, method == b"HEAD", reset_midway, cut_midway)
                if reset_midway or cut_midway:
                    return
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError, OSError):
            pass
        except asyncio.CancelledError:
            _reset(writer)  # stop(): the server is gone
        finally:
            self._writers.discard(writer)
            if up_w is not None:
                up_w.close()
            if not writer.is_closing():
                writer.close()

    async def _relay_response(
        self,
        up: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        head_only: bool,
        reset_midway: bool,
        cut_midway: bool = False,
    ) -> None:
        head = await up.readuntil(b"\r\n\r\n")
        writer.write(head)
        if head_only or head.split(b" ", 2)[1] in (b"204", b"304"):
            await writer.drain()
            return
        if b"transfer-encoding: chunked" in head.lower():
            while True:
                line = await up.readuntil(b"\r\n")
                size = int(line.split(b";")[0], 16)
                data = await up.readexactly(size + 2)
                writer.write(line + data)
                if size == 0:
                    break
            await writer.drain()
            return
        left = _content_length(head)
        if cut_midway or reset_midway:
            await _relay_part(up, writer, left // 2 + (777 if cut_midway else 0))
            if cut_midway:
                self.stats.cuts += 1
                writer.close()  # FIN after a short body
                return
            self.stats.resets += 1
            _reset(writer)
            raise ConnectionResetError
        while left > 0:
            chunk = await up.read(min(left, 65536))
            if not chunk:
                raise ConnectionResetError
            left -= len(chunk)
            writer.write(chunk)
            await writer.drain()
            if self.rate:
                await asyncio.sleep(len(chunk) / self.rate)


async def _relay_part(up: asyncio.StreamReader, writer: asyncio.StreamWriter, nbytes: int) -> None:
    """Relays the first `nbytes` of a body, before a fault ends the response."""
    while nbytes > 0:
        chunk = await up.read(min(nbytes, 65536))
        if not chunk:
            break
        nbytes -= len(chunk)
        writer.write(chunk)
    await writer.drain()


def _header(head: bytes, name: bytes) -> list[str]:
    prefix = name.lower() + b":"
    return [
        line.split(b":", 1)[1].strip().decode()
        for line in head.split(b"\r\n")
        if line.lower().startswith(prefix)
    ]


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return 0


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST (SO_LINGER 0), the way a crashed server or a middlebox drops a connection."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()
