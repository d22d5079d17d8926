"""TLS to the store: the CA bundle every request trusts, and a first handshake that fails fast.

AWS_CA_BUNDLE (or a profile's `ca_bundle`) names the certificates of a private CA in front of a
store (MinIO, Ceph, an internal gateway). boto3 and s5cmd trust it, so the CRT client (listings,
HEADs, small objects) and cache.ranged (big objects' pieces) trust it too.

The probe: when the CRT cannot verify a certificate, s2n "blinds" the failure (it keeps the
connection 10-30 s before reporting, against timing side channels) and the CRT then retries it like
any connection error. `rq preload` against a store it did not trust sat silent for minutes (measured:
~12 s per attempt, 7 attempts) before it said anything. One handshake with Python's ssl on a thread
of its own, beside the CRT's first request, learns the same thing in milliseconds.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import threading
from collections.abc import Callable
from typing import Any

from cache.errors import BadSourceError, CacheError, TlsError, UnreachableError


def crt_tls_options(bundle: str) -> Any:
    """CRT connection options that trust the certificates in `bundle` (instead of the system's,
    as botocore does with a ca_bundle)."""
    from awscrt import io as crt_io

    try:
        options = crt_io.TlsContextOptions()
        options.override_default_trust_store_from_path(None, bundle)
        return crt_io.ClientTlsContext(options).new_connection_options()
    except OSError as exc:
        reason = exc.strerror or str(exc)
    except Exception:  # the CRT's own error: the file parsed to no certificate
        reason = "no PEM certificate in it"
    raise BadSourceError(f"cannot use the CA bundle {bundle!r} (AWS_CA_BUNDLE / ca_bundle): {reason}")


# where aws-c-io looks for the system's trust store when no bundle is named, in its order: the probe
# must trust exactly what the CRT trusts, or it would fail a store the CRT reaches fine
_CRT_CA_FILES = (
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/pki/tls/cacert.pem",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/ssl/cert.pem",
)
_CRT_CA_DIRS = (
    "/etc/ssl/certs",
    "/etc/pki/tls/certs",
    "/system/etc/security/cacerts",
    "/usr/local/share/certs",
    "/etc/openssl/certs",
)
# a certificate verdict waits this long for the CRT to prove it wrong (a reply over TLS) before it
# ends the waits: s2n and OpenSSL may still judge an odd certificate differently. (A server that
# does not speak TLS at all is told at once: the CRT cannot do better there.)
GRACE_S = 5.0
# OpenSSL verify codes that mean "no trusted CA issued this": the bundle is what to fix
_UNKNOWN_ISSUER = {2, 18, 19, 20, 21}


def _context(bundle: str | None) -> Any:
    import ssl

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the chain and the host name
    allow_partial_chain(context)
    if bundle:
        context.load_verify_locations(cafile=bundle)
        return context
    cafile = next((p for p in _CRT_CA_FILES if os.path.exists(p)), None)
    capath = next((p for p in _CRT_CA_DIRS if os.path.isdir(p)), None)
    if cafile is None and capath is None:
        raise FileNotFoundError("no system trust store")
    context.load_verify_locations(cafile=cafile, capath=capath)
    return context


def allow_partial_chain(context: Any) -> None:
    """A bundle may hold an intermediate CA alone: s2n (the CRT) trusts a chain that ends there, and
    so do Python 3.13's default contexts; OpenSSL's default insists on a self-signed root."""
    import ssl

    flag = getattr(ssl, "VERIFY_X509_PARTIAL_CHAIN", 0)
    if flag:
        context.verify_flags |= flag


def tls_error(endpoint: str, exc: Any) -> TlsError:
    """One line for a certificate OpenSSL refused, with what to do about that kind of refusal."""
    error = TlsError(f"the TLS certificate of {endpoint} is not trusted: {exc.verify_message}")
    if exc.verify_code in _UNKNOWN_ISSUER:
        error.hint = "a private CA? point AWS_CA_BUNDLE at its certificates"
    elif exc.verify_code in (62, 64):  # X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH
        error.hint = "use the host name the certificate was issued for in the endpoint URL"
    else:
        error.hint = "the store's certificate needs renewing or replacing"
    return error


def handshake_failure(
    host: str,
    port: int,
    bundle: str | None,
    endpoint: str,
    timeout: float,
    on_socket: Callable[[socket.socket], None] | None = None,
) -> CacheError | None:
    """What one TLS handshake with the store says is wrong with its TLS, or None: trusted, or not
    reachable at all (which the CRT's own request reports, as for plain HTTP). `on_socket` gets
    the socket before the handshake, so that it can be shut down to cut the handshake short.
    Behind the proxy the CRT would use (HTTPS_PROXY, NO_PROXY: cache.proxy), the handshake goes
    through a CONNECT tunnel of that proxy, as the CRT's does; a proxy that fails is the CRT's
    request's to report."""
    import ssl

    try:
        context = _context(bundle)
    except (OSError, ValueError, ssl.SSLError):  # (the CRT read the same bundle first)
        return None
    try:
        # wrap_socket detaches the plain socket (its fd moves to the TLS socket): handed that one,
        # a stop() shut down nothing and waited out the handshake's timeout
        with (
            _connect(host, port, timeout) as sock,
            context.wrap_socket(sock, server_hostname=host, do_handshake_on_connect=False) as tls,
        ):
            if on_socket is not None:
                on_socket(tls)
            tls.do_handshake()
            return None
    except ssl.SSLCertVerificationError as exc:
        return tls_error(endpoint, exc)
    except ssl.SSLError as exc:  # not TLS at all (an http:// server), or no protocol in common
        return UnreachableError(f"cannot speak TLS with {endpoint}: {exc.reason or exc}")
    except (OSError, ValueError):
        return None


def _connect(host: str, port: int, timeout: float) -> socket.socket:
    """A TCP connection to the store, or a CONNECT tunnel to it through the proxy boto3 would use
    for https://host:port (port 443 is left out of the name NO_PROXY is matched on, as in a URL)."""
    from cache.proxy import proxy_for

    try:
        proxy = proxy_for("https", host if port == 443 else f"{host}:{port}")
    except CacheError:  # a proxy URL rq cannot use: the big objects' path says so
        proxy = None
    if proxy is None:
        return socket.create_connection((host, port), timeout=timeout)
    import http.client

    conn = http.client.HTTPConnection(proxy.host, proxy.port, timeout=timeout)
    conn.set_tunnel(host, port, headers=proxy.headers())
    try:
        conn.connect()  # raises OSError (the proxy's refusal, or none reached): reported by the CRT
    except BaseException:
        conn.close()
        raise
    sock, conn.sock = conn.sock, None  # the tunnel's socket is the handshake's now
    assert sock is not None
    return sock


class TlsCheck:
    """The probe's verdict, handed to whoever waits on a CRT reply so that a certificate the CRT
    would spend minutes retrying ends their wait at once. A reply that came over TLS (`passed`), at
    any time, overrules it."""

    def __init__(self, host: str, port: int, bundle: str | None, endpoint: str, timeout: float):
        self._failure: CacheError | None = None  # set once the verdict ends the waits
        self._done = False
        self._crt_ok = threading.Event()
        self._waiters: list[Callable[[CacheError], None]] = []
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._stopping = False
        args = (host, port, bundle, endpoint, timeout)
        self._thread = threading.Thread(target=self._run, args=args, name="rq-tls-probe", daemon=True)
        with _probes_lock:
            _probes.add(self)
        self._thread.start()

    def passed(self) -> None:
        """The CRT got a reply (or its headers) over TLS: its trust works, whatever the probe says."""
        if not self._crt_ok.is_set():
            self._crt_ok.set()

    def failure(self) -> CacheError | None:
        """The verdict as a new exception (each raise gets its own traceback), or None."""
        failure = self._failure
        if failure is None or self._crt_ok.is_set():
            return None
        return _copy(failure)

    def _run(self, host: str, port: int, bundle: str | None, endpoint: str, timeout: float) -> None:
        try:
            failure = handshake_failure(host, port, bundle, endpoint, timeout, self._got_socket)
        finally:
            with self._lock:
                self._sock = None
            with _probes_lock:
                _probes.discard(self)
        if isinstance(failure, TlsError) and self._crt_ok.wait(GRACE_S):
            failure = None
        with self._lock:
            self._failure, self._done = failure, True
            waiters, self._waiters = self._waiters, []
        if failure is not None and not self._crt_ok.is_set():
            for callback in waiters:
                callback(_copy(failure))

    def _got_socket(self, sock: socket.socket) -> None:
        with self._lock:
            self._sock = sock
            stopping = self._stopping
        if stopping:
            _shutdown(sock)

    def stop(self, timeout: float) -> None:
        """Cuts the handshake short and waits up to `timeout` for the thread to leave OpenSSL."""
        with self._lock:
            self._stopping = True
            sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                _shutdown(sock)
        self._thread.join(timeout)

    def on_failure(self, callback: Callable[[CacheError], None]) -> None:
        """callback(error) if the handshake failed: now if it has, later if it does; never if it
        passed or a reply over TLS overruled it (after which nothing is kept)."""
        with self._lock:
            if not self._done:
                self._waiters.append(callback)
                return
        failure = self.failure()
        if failure is not None:
            callback(failure)


def _shutdown(sock: socket.socket) -> None:
    """Wakes the thread blocked in the handshake on `sock`. The plain socket's shutdown: a TLS
    socket's own drops its SSL object, which that thread may not have reached yet."""
    socket.socket.shutdown(sock, socket.SHUT_RDWR)


# Probes still running. A daemon thread inside OpenSSL (loading the trust store, mid-handshake)
# when the process exits crashed it: libcrypto's exit handler frees what that thread is using
# (measured: exit 139 in 5 of 30 `rq preload` runs that failed fast against an https store).
_probes: set[TlsCheck] = set()
_probes_lock = threading.Lock()


def _after_fork_in_child() -> None:
    """A forked child has none of the parent's probe threads. Stopping their probes at its exit
    would shut down sockets it shares with the parent (cutting the parent's handshake) and could
    wait on a lock a parent thread held at the fork; the lock is made anew for the same reason."""
    global _probes, _probes_lock
    _probes = set()
    _probes_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


@atexit.register
def _stop_probes() -> None:
    with _probes_lock:
        running = list(_probes)
    for probe in running:
        probe.stop(timeout=2.0)


def _copy(error: CacheError) -> CacheError:
    copy = type(error)(str(error))
    copy.__dict__.update(error.__dict__)  # (the hint)
    return copy
