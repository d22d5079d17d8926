"""Big objects' ranged pieces on plain keep-alive HTTP connections, read straight into aligned buffers.

Why not the CRT here (measured, docs/cache.md): for 8 x 128 MiB the CRT path cost rq ~1.4 CPU-s per
GiB. Its parts land in fresh CRT buffers (fresh memory is slow to touch on this VM), are copied into
rq's aligned buffers and written from there. Here one worker thread per piece signs a GET with the
CRT's SigV4 signer (same credentials, same endpoint) and `readinto`s the body straight into a page-aligned
buffer it reuses for the whole run. That buffer is then written around the page cache from the same
memory: one copy in all, the kernel's. The same set took ~0.65 CPU-s and 1.1-1.2 s instead of 1.9-2.0 s.
Small objects stay on the CRT, which writes them in C without Python per chunk.

Retries mirror the CRT's STANDARD mode: exponential backoff with full jitter on 5xx, throttling and
lost connections, a bounded number of attempts without progress. A retry resumes at the first byte
not yet handed on: the body is read in 1 MiB slices, so a lost connection costs at most the slice
that was on its way.
"""

from __future__ import annotations

import contextlib
import http.client
import random
import socket
import ssl
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cache.directio import ALIGN, aligned_buffer
from cache.errors import CacheError, OriginError, UnreachableError
from cache.proxy import Proxy, proxy_for, tunnel_refusal
from cache.tls import allow_partial_chain, tls_error

if TYPE_CHECKING:
    from cache.s3 import S3

Sink = Callable[[memoryview, int], None]  # (bytes in an aligned buffer, their offset in the object)
Done = Callable[[BaseException | None], None]

CONNECT_TIMEOUT_S = 3.0  # as the CRT client's connect_timeout_ms
LOST_MID_BODY_HINT = (
    "the store answered, then kept dropping connections mid-body; re-run the same command to continue"
)
READ_TIMEOUT_S = 30.0  # a store that goes silent mid-body is a lost connection, retried
BACKOFF_SCALE_S = 0.05
BACKOFF_MAX_S = 4.0
_ERROR_BODY_MAX = 64 << 10
SLICE = 1 << 20  # one readinto: what a reset can cost (BufferedReader drops a call's bytes on error)
# Each worker's buffer. The sink writes it and hashes it (xxh3 and CRC32) right after it arrived, so
# it should still be in the core's L2: with 1 MiB instead of 8 the 8 x 128 MiB bench took 0.58
# instead of 0.64 CPU-s and a median 1.06 instead of 1.10 s (12 alternated rounds).
BUFFER = 1 << 20
RETRY_CODES = {"RequestTimeout", "InternalError", "ServiceUnavailable"}


class Cancelled(OriginError):
    """The fetcher gave the request up (the run is failing); reported through on_done like any end."""


class RangedRequest:
    """What `RangedGets.start` returns: something the fetcher can cancel."""

    def __init__(self) -> None:
        self.cancelled = False
        self.sock: socket.socket | None = None  # the connection's socket while a body is read

    def cancel(self) -> None:
        self.cancelled = True
        sock = self.sock
        if sock is not None:
            # wakes a worker blocked in recv on a slow store at once (it then sees `cancelled`)
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


@dataclass
class _Cursor:
    offset: int  # the first byte of the range not yet handed to the sink


class _Retry(Exception):
    """One attempt failed in a way worth another (carries the error to raise when attempts run out)."""

    def __init__(self, error: CacheError):
        super().__init__(str(error))
        self.error = error


class RangedGets:
    """A few worker threads, each with its own connection and aligned buffer; one piece at a time."""

    def __init__(self, client: S3, workers: int = 8):
        self.client = client
        self.pool = ThreadPoolExecutor(max(1, workers), thread_name_prefix="rq-range")
        self._local = threading.local()
        self.max_retries = client.settings.max_retries
        self._contexts: dict[str, ssl.SSLContext] = {}
        # the proxy boto3 and the CRT send this endpoint's requests through (cache.proxy), or None
        self.proxy: Proxy | None = proxy_for(client.scheme, client.netloc)

    def start(
        self, bucket: str, key: str, rng: tuple[int, int], if_match: str | None, sink: Sink, on_done: Done
    ) -> RangedRequest:
        """Fetches the inclusive byte range `rng` into `sink`, then calls `on_done` exactly once."""
        request = RangedRequest()

        def run() -> None:
            try:
                self._fetch(bucket, key, rng, if_match, sink, request)
            except BaseException as exc:
                on_done(exc)
            else:
                on_done(None)

        self.pool.submit(run)
        return request

    # --- one piece, on a worker thread ---------------------------------------------------------

    def _fetch(
        self,
        bucket: str,
        key: str,
        rng: tuple[int, int],
        if_match: str | None,
        sink: Sink,
        req: RangedRequest,
    ) -> None:
        cursor = _Cursor(rng[0])
        failures = 0
        while cursor.offset <= rng[1]:
            before = cursor.offset
            try:
                self._attempt(bucket, key, cursor, rng[1], if_match, sink, req)
            except _Retry as retry:
                self._drop_connection()
                failures = 1 if cursor.offset > before else failures + 1
                if failures > self.max_retries:
                    raise retry.error from None
                time.sleep(random.uniform(0, min(BACKOFF_MAX_S, BACKOFF_SCALE_S * 2**failures)))
            except BaseException:
                # an error reply, a full disk in the sink, a cancel: the connection may still hold
                # unread body bytes, so the next piece on this thread must not reuse it
                self._drop_connection()
                raise

    def _attempt(
        self,
        bucket: str,
        key: str,
        cursor: _Cursor,
        end: int,
        if_match: str | None,
        sink: Sink,
        req: RangedRequest,
    ) -> None:
        """One GET of [cursor.offset, end], advancing the cursor past every buffer handed to the
        sink, so a retry after a lost connection resumes at the first byte not yet written."""
        what = f"s3://{bucket}/{key}"
        if req.cancelled:
            raise Cancelled(f"{what}: cancelled")
        host, path = self.client._target(bucket, key)
        headers = [("Range", f"bytes={cursor.offset}-{end}")]
        if if_match:
            headers.append(("If-Match", f'"{if_match}"'))
        try:
            signed = self._sign(host, path, headers)
        except Exception as exc:  # the CRT signer refused (bad credentials in the provider, …)
            raise OriginError(f"{what}: could not sign the request ({exc})") from None
        proxy = self.proxy
        forward = proxy is not None and self.client.scheme == "http"
        try:
            conn = self._connection(host)
            # an http endpoint behind a proxy: absolute-form requests to the proxy, as urllib3 sends
            # them (an https one goes through a CONNECT tunnel: origin-form inside it). The Host
            # header, and so the signature, stays the store's
            conn.putrequest(
                "GET", f"http://{host}{path}" if forward else path, skip_host=True, skip_accept_encoding=True
            )
            for name, value in signed:
                conn.putheader(name, value)
            if forward and proxy is not None and proxy.authorization:
                conn.putheader("Proxy-Authorization", proxy.authorization)
            conn.endheaders()
            resp = conn.getresponse()
        except ssl.SSLCertVerificationError as exc:  # retrying cannot make the store trusted
            raise tls_error(self.client.endpoint_text, exc) from None
        except (OSError, http.client.HTTPException) as exc:
            raise self._connect_failure(exc) from None
        if forward and proxy is not None and resp.status == 407:  # only ever a proxy's answer
            _read_bounded(resp)
            raise proxy.refused(self.client.endpoint_text, resp.status, resp.reason or "")
        if resp.status not in (200, 206):
            from cache.s3 import _error_code, map_error

            body = _read_bounded(resp)
            error = map_error(
                what,
                None,
                resp.status,
                body,
                self.client.endpoint_text,
                resp.getheaders(),
                self.client.creds.region,
            )
            if (
                resp.status >= 500
                or getattr(error, "throttled", False)
                or _error_code(body)[0] in RETRY_CODES
            ):
                raise _Retry(error)
            raise error
        self._check_span(what, resp, cursor.offset, end)
        view = self._buffer()
        req.sock = conn.sock
        try:
            self._read_body(what, resp, view, cursor, end, sink, req)
        finally:
            req.sock = None

    @staticmethod
    def _check_span(what: str, resp: http.client.HTTPResponse, offset: int, end: int) -> None:
        """A store that ignored the Range header, or sent another span: never write it as ours."""
        length = end - offset + 1
        declared = resp.getheader("Content-Length") or ""
        span = (resp.getheader("Content-Range") or "").partition("/")[0].strip()
        if resp.status == 206:
            ok = declared == str(length) and span == f"bytes {offset}-{end}"
        else:  # 200: only right when the range asked for was the whole object from byte 0
            ok = offset == 0 and declared == str(length)
        if not ok:
            raise OriginError(
                f"{what}: asked for bytes {offset}-{end}, the store sent {span or 'a whole body'} ({declared or '?'} bytes)"
            )

    @staticmethod
    def _read_body(
        what: str,
        resp: http.client.HTTPResponse,
        view: memoryview,
        cursor: _Cursor,
        end: int,
        sink: Sink,
        req: RangedRequest,
    ) -> None:
        """Fills the buffer a slice at a time and hands each full buffer on; after a lost connection
        hands on the whole pages that did arrive, so the retry starts after them, still aligned."""
        while cursor.offset <= end:
            want = min(len(view), end + 1 - cursor.offset)
            got = 0
            try:
                while got < want:
                    if req.cancelled:
                        raise Cancelled(f"{what}: cancelled")
                    n = resp.readinto(view[got : min(want, got + SLICE)])
                    if not n:
                        raise http.client.IncompleteRead(b"", want - got)
                    got += n
            except (OSError, http.client.HTTPException) as exc:
                if req.cancelled:
                    raise Cancelled(f"{what}: cancelled") from None
                kept = got // ALIGN * ALIGN
                if kept:
                    sink(view[:kept], cursor.offset)
                    cursor.offset += kept
                lost = UnreachableError(f"{what}: connection lost mid-body ({type(exc).__name__})")
                # the store answered: "check --endpoint-url" would point the wrong way (np2)
                lost.hint = LOST_MID_BODY_HINT  # type: ignore[attr-defined]
                raise _Retry(lost) from None
            sink(view[:got], cursor.offset)
            cursor.offset += got

    # --- per-thread state ----------------------------------------------------------------------

    def _connection(self, host: str) -> http.client.HTTPConnection:
        """This thread's keep-alive connection to `host` (virtual-hosted buckets differ in host)."""
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is not None and (getattr(self._local, "host", None) != host or conn.sock is None):
            # another host, or the store closed it (`Connection: close`): http.client would reconnect
            # by itself, but with the connect timeout as the read timeout
            self._drop_connection()
            conn = None
        if conn is None:
            proxy = self.proxy
            if proxy is None:
                if self.client.scheme == "https":
                    conn = http.client.HTTPSConnection(host, timeout=CONNECT_TIMEOUT_S, context=self._tls())
                else:
                    conn = http.client.HTTPConnection(host, timeout=CONNECT_TIMEOUT_S)
            elif self.client.scheme == "https":
                # TCP to the proxy, CONNECT host:port, then TLS with the store inside the tunnel
                # (its name for SNI and the certificate check)
                conn = http.client.HTTPSConnection(
                    proxy.host, proxy.port, timeout=CONNECT_TIMEOUT_S, context=self._tls()
                )
                conn.set_tunnel(host, headers=proxy.headers())
            else:
                conn = http.client.HTTPConnection(proxy.host, proxy.port, timeout=CONNECT_TIMEOUT_S)
            conn.connect()
            assert conn.sock is not None
            conn.sock.settimeout(READ_TIMEOUT_S)
            self._local.conn, self._local.host = conn, host
        return conn

    def _tls(self) -> ssl.SSLContext:
        # the CA bundle the CRT client trusts (AWS_CA_BUNDLE or the profile's ca_bundle); built once
        bundle = self.client.creds.ca_bundle or ""
        context = self._contexts.get(bundle)
        if context is None:
            context = self._contexts[bundle] = ssl.create_default_context(cafile=bundle or None)
            allow_partial_chain(context)  # trust what the CRT trusts (cache.tls)
        return context

    def _drop_connection(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def _buffer(self) -> memoryview:
        view: memoryview | None = getattr(self._local, "buf", None)
        if view is None:
            view = self._local.buf = aligned_buffer(BUFFER)
        return view

    def _sign(self, host: str, path: str, headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
        from awscrt import auth
        from awscrt import http as crt_http

        request = crt_http.HttpRequest("GET", path, crt_http.HttpHeaders([("Host", host), *headers]))
        auth.aws_sign_request(request, self.client.signing).result()
        return list(request.headers)

    def _unreachable(self, exc: BaseException) -> UnreachableError:
        return UnreachableError(f"cannot reach {self.client.endpoint_text} ({type(exc).__name__}: {exc})")

    def _connect_failure(self, exc: BaseException) -> BaseException:
        """What a failed connection or request (before any reply) raises: a retry, or a proxy's
        refusal (407: its credentials, never retried)."""
        proxy = self.proxy
        if proxy is None or isinstance(exc, ssl.SSLError):  # (TLS is the store's, inside a tunnel)
            return _Retry(self._unreachable(exc))
        refusal = tunnel_refusal(exc)
        if refusal is not None:
            error = proxy.refused(self.client.endpoint_text, *refusal)
            return error if refusal[0] == 407 else _Retry(error)
        # nothing came back: with a proxy in between, the first hop is the one to name
        return _Retry(proxy.unreachable(self.client.endpoint_text, exc))


def _read_bounded(resp: http.client.HTTPResponse) -> bytes:
    try:
        return resp.read(_ERROR_BODY_MAX)
    except (OSError, http.client.HTTPException):
        return b""
