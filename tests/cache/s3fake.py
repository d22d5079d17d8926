"""A store of the test's own that answers S3 requests the way a test tells it to: listing pages
that are not ListBucketResults, keys outside the prefix, replies without an ETag, bodies that
stall. Fault injection (like faultproxy.py): no real S3 server sends these replies, and rq must
still end with one clear line and its documented exit code.

`FakeS3.pages` maps a continuation token (None: the first page) to a reply; `FakeS3.objects` maps
a key to one. A reply is (status, headers, body) or a callable given the handler, which writes
whatever it likes (a body that stalls)."""

from __future__ import annotations

import base64
import hashlib
import http.server
import threading
import urllib.parse
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from xml.sax.saxutils import escape

Reply = tuple[int, dict[str, str], bytes] | Callable[[http.server.BaseHTTPRequestHandler, bool], None]
ENV = {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_REGION": "us-east-1", "CI": "1"}


def list_page(keys: dict[str, bytes], token: str | None = None, truncated: bool | None = None) -> Reply:
    """A ListObjectsV2 page of `keys` (key -> body: its size and MD5 ETag); `token`: the next page's."""
    more = token is not None if truncated is None else truncated
    parts = [
        '<?xml version="1.0" encoding="UTF-8"?>'
        '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>b</Name>'
        f"<IsTruncated>{'true' if more else 'false'}</IsTruncated>"
    ]
    if token is not None:
        parts.append(f"<NextContinuationToken>{escape(token)}</NextContinuationToken>")
    for key, body in keys.items():
        etag = hashlib.md5(body).hexdigest()
        parts.append(
            f"<Contents><Key>{urllib.parse.quote(key, safe='/')}</Key><Size>{len(body)}</Size>"
            f"<ETag>&quot;{etag}&quot;</ETag></Contents>"
        )
    parts.append("</ListBucketResult>")
    return 200, {"Content-Type": "application/xml"}, "".join(parts).encode()


def object_reply(body: bytes) -> Reply:
    """An object as S3 serves it: ETag (MD5) and CRC32 headers."""
    crc = base64.b64encode(zlib.crc32(body).to_bytes(4, "big")).decode()
    headers = {"ETag": f'"{hashlib.md5(body).hexdigest()}"', "x-amz-checksum-crc32": crc}
    return 200, {**headers, "Content-Type": "application/octet-stream"}, body


HTML = (200, {"Content-Type": "text/html"}, b"<html><body>Error: service unavailable</body></html>")


class FakeS3:
    def __init__(self) -> None:
        self.pages: dict[str | None, Reply] = {}
        self.objects: dict[str, Reply] = {}
        self.requests: list[str] = []  # "GET /b/key" / "HEAD /b/key" / "LIST token"
        self.stop = threading.Event()  # set when the store shuts down: stalled replies end
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                fake._answer(self, head=False)

            def do_HEAD(self) -> None:
                fake._answer(self, head=True)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def _answer(self, handler: http.server.BaseHTTPRequestHandler, head: bool) -> None:
        url = urllib.parse.urlsplit(handler.path)
        query = urllib.parse.parse_qs(url.query)
        if "list-type" in query:
            token = query.get("continuation-token", [None])[0]
            self.requests.append(f"LIST {token}")
            reply = self.pages.get(token, (404, {}, b"<Error><Code>NoSuchKey</Code></Error>"))
        else:
            key = urllib.parse.unquote(url.path).split("/", 2)[2]
            self.requests.append(f"{'HEAD' if head else 'GET'} {key}")
            reply = self.objects.get(key, (404, {}, b"<Error><Code>NoSuchKey</Code></Error>"))
        write_reply(handler, reply, head)

    def slow_body(self, body: bytes, sent: int, rate: float | None = None) -> Reply:
        """The object's headers and its first `sent` bytes, then nothing until the store stops
        (`rate` None) or the rest at `rate` bytes a second (a trickle, or a slow link)."""
        status, headers, _ = object_reply(body)  # type: ignore[misc]

        def reply(handler: http.server.BaseHTTPRequestHandler, head: bool) -> None:
            _send_head(handler, status, headers, len(body))
            if head:
                return
            handler.wfile.write(body[:sent])
            handler.wfile.flush()
            handler.close_connection = True
            if rate is None:
                self.stop.wait()
                return
            step = max(1, int(rate / 10))
            for i in range(sent, len(body), step):
                if self.stop.wait(step / rate):
                    return
                handler.wfile.write(body[i : i + step])
                handler.wfile.flush()

        return reply


def write_reply(handler: http.server.BaseHTTPRequestHandler, reply: Reply, head: bool = False) -> None:
    if callable(reply):
        reply(handler, head)
        return
    status, headers, body = reply
    _send_head(handler, status, headers, len(body))
    if not head:
        handler.wfile.write(body)


def _send_head(
    handler: http.server.BaseHTTPRequestHandler, status: int, headers: dict[str, str], n: int
) -> None:
    handler.send_response(status)
    for name, value in headers.items():
        handler.send_header(name, value)
    handler.send_header("Content-Length", str(n))
    handler.end_headers()


@contextmanager
def fake_s3() -> Iterator[FakeS3]:
    fake = FakeS3()
    thread = threading.Thread(target=fake.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        fake.stop.set()
        fake.server.shutdown()
        fake.server.server_close()


def dry_run_against(
    store: FakeS3, cache_dir: Any, source: str = "s3://b/p/"
) -> tuple[int, str, dict[str, Any]]:
    """`rq preload SOURCE --dry-run --json` against the fake store: (exit code, stderr, the final
    summary line)."""
    import json

    from rqtest import run_rq

    proc = run_rq(
        "preload", source, "--endpoint-url", store.endpoint, "--cache-dir", str(cache_dir),
        "--dry-run", "--json", env=ENV, timeout=60,
    )  # fmt: skip
    summary = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    return proc.returncode, proc.stderr.decode(), summary
