"""Big objects' pieces (cache.ranged) and the TLS probe (cache.tls) go through the proxy boto3 and the
CRT use: HTTP_PROXY / HTTPS_PROXY / NO_PROXY (cache.proxy).

They opened their own connections straight to the endpoint: behind a corporate proxy, whose store
name only the proxy resolves, listings and small objects worked and `rq preload` of a big object
stopped with "cannot reach ... (gaierror)". A forward proxy written here (absolute-form GETs and
CONNECT, one made-up host name it alone resolves, requests counted) stands in front of the real
SeaweedFS; for https a TLS front with a certificate for that name, signed by a CA made here."""

from __future__ import annotations

import base64
import datetime
import os
import socket
import socketserver
import ssl
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from cachekit import payload
from rqtest import run_rq

pytestmark = pytest.mark.integration

NAME = "s3.rq-px.internal"  # resolves nowhere but in the proxy
BIG = 70 << 20  # over the 64 MiB that sends an object to cache.ranged
PORTS = range(24850, 24900)


class ForwardProxy:
    """A threaded forward proxy on 127.0.0.1: absolute-form requests (each on a connection of its
    own to the origin, `Connection: close`) and CONNECT tunnels. NAME resolves to 127.0.0.1 here
    only. `auth` (user, password) makes it answer 407 without that Proxy-Authorization;
    `down_after` n requests, it stops listening (a proxy that goes down mid-run)."""

    def __init__(self, auth: tuple[str, str] | None = None, down_after: int | None = None):
        self.auth = None if auth is None else "Basic " + base64.b64encode(":".join(auth).encode()).decode()
        self.down_after = down_after
        self.lock = threading.Lock()
        self.requests: list[tuple[str, str, str]] = []  # (method, target, Range header)
        self.refused = 0
        proxy = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                proxy._handle(self.request)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True

        for port in PORTS:
            try:
                self.server = Server(("127.0.0.1", port), Handler)
                break
            except OSError:
                continue
        else:
            raise RuntimeError("no free port in 24850-24899")
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self._down = threading.Event()
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def stop(self) -> None:
        if not self._down.is_set():
            self._down.set()
            self.server.shutdown()
        self.server.server_close()

    def methods(self, method: str) -> list[tuple[str, str, str]]:
        with self.lock:
            return [r for r in self.requests if r[0] == method]

    def _handle(self, client: socket.socket) -> None:
        client.settimeout(20)
        upstream: socket.socket | None = None
        try:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = client.recv(65536)
                if not chunk:
                    return
                head += chunk
            head, _, rest = head.partition(b"\r\n\r\n")
            first, *lines = head.decode("latin-1").split("\r\n")
            method, target, version = first.split(" ", 2)
            headers = [(k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in lines)]
            given = {k.lower(): v for k, v in headers}
            with self.lock:
                self.requests.append((method, target, given.get("range", "")))
                count = len(self.requests)
            if self.down_after is not None and count >= self.down_after and not self._down.is_set():
                self._down.set()
                threading.Thread(target=self.stop, daemon=True).start()
            if self.auth is not None and given.get("proxy-authorization") != self.auth:
                with self.lock:
                    self.refused += 1
                client.sendall(
                    b"HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic\r\n"
                    b"Content-Length: 0\r\nConnection: close\r\n\r\n"
                )
                return
            if method == "CONNECT":
                host, _, port = target.rpartition(":")
                upstream = socket.create_connection(("127.0.0.1" if host == NAME else host, int(port)), 10)
                client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                url = urlsplit(target)  # absolute-form: http://host:port/path?query
                assert url.scheme == "http" and url.hostname, target
                host = "127.0.0.1" if url.hostname == NAME else url.hostname
                upstream = socket.create_connection((host, url.port or 80), 10)
                path = url.path + (f"?{url.query}" if url.query else "")
                skip = ("proxy-authorization", "proxy-connection", "connection")
                kept = [f"{k}: {v}" for k, v in headers if k.lower() not in skip]
                head = "\r\n".join([f"{method} {path} {version}", *kept, "Connection: close", "", ""])
                rest = head.encode("latin-1") + rest
            if rest:
                upstream.sendall(rest)
            back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
            back.start()
            _pump(client, upstream)
            back.join(20)
        except OSError:
            pass
        finally:
            if upstream is not None:
                upstream.close()
            client.close()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(1 << 20):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


@pytest.fixture
def proxies() -> Iterator[Any]:
    made: list[ForwardProxy] = []

    def make(**kwargs: Any) -> ForwardProxy:
        made.append(ForwardProxy(**kwargs))
        return made[-1]

    yield make
    for proxy in made:
        proxy.stop()


@pytest.fixture(scope="module")
def big(services: Any) -> Iterator[tuple[str, str, bytes]]:
    """A bucket px-… of this module's own with one 70 MiB object under big/."""
    import boto3

    s3 = boto3.client(
        "s3",
        endpoint_url=services.s3_endpoint,
        aws_access_key_id=services.access_key,
        aws_secret_access_key=services.secret_key,
        region_name="us-east-1",
    )
    bucket = f"px-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    body = payload(70, BIG)
    s3.put_object(Bucket=bucket, Key="big/obj.bin", Body=body)
    yield bucket, "big/obj.bin", body
    s3.delete_object(Bucket=bucket, Key="big/obj.bin")
    s3.delete_bucket(Bucket=bucket)


def _clean(env: dict[str, str]) -> dict[str, str]:
    """The environment without the caller's own proxy variables (run_rq passes os.environ on)."""
    names = ("http_proxy", "https_proxy", "no_proxy", "all_proxy")
    return {k: v for k, v in env.items() if k.lower() not in names}


def _rq(*args: str, env: dict[str, str]) -> Any:
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "rqcli", *args],
        env={**_clean(dict(os.environ)), "CI": "1", **env},
        capture_output=True,
        timeout=60,
        check=False,
    )


def _cached(cache_env: dict[str, str], url: str) -> bytes:
    from cache import Cache

    with Cache(Path(cache_env["RQ_CACHE_DIR"])) as c:
        return c.read_bytes(url)


def test_a_big_object_lands_and_verifies_through_the_http_proxy(
    big: tuple[str, str, bytes], cache_env: dict[str, str], proxies: Any, services: Any
) -> None:
    bucket, key, body = big
    proxy = proxies(auth=("px", "secret"))
    port = urlsplit(services.s3_endpoint).port
    env = {
        **cache_env,
        "AWS_ENDPOINT_URL": f"http://{NAME}:{port}",
        "HTTP_PROXY": f"http://px:secret@127.0.0.1:{proxy.port}",
    }
    proc = _rq("preload", f"s3://{bucket}/big/", "--json", env=env)
    assert proc.returncode == 0, proc.stderr.decode()
    # the pieces: absolute-form GETs with a Range, to the store's name (signed for it), credentials sent
    pieces = [r for r in proxy.methods("GET") if r[1] == f"http://{NAME}:{port}/{bucket}/{key}" and r[2]]
    assert len(pieces) >= 2, proxy.requests
    assert proxy.refused == 0
    assert _cached(cache_env, f"s3://{bucket}/{key}") == body
    verify = run_rq("cache", "verify", env=cache_env)
    assert verify.returncode == 0, verify.stderr.decode()


def test_no_proxy_sends_the_pieces_straight_to_the_store(
    big: tuple[str, str, bytes], cache_env: dict[str, str], proxies: Any, services: Any
) -> None:
    bucket, key, body = big
    proxy = proxies()
    env = {**cache_env, "HTTP_PROXY": proxy.url, "no_proxy": "example.com, 127.0.0.1"}
    proc = _rq("preload", f"s3://{bucket}/big/", env=env)
    assert proc.returncode == 0, proc.stderr.decode()
    assert proxy.requests == []
    assert _cached(cache_env, f"s3://{bucket}/{key}") == body


def test_a_proxy_that_goes_down_is_one_line_naming_it(
    big: tuple[str, str, bytes], cache_env: dict[str, str], proxies: Any, services: Any
) -> None:
    bucket, _, _ = big
    proxy = proxies(down_after=1)  # serves the listing, then listens no more
    port = urlsplit(services.s3_endpoint).port
    env = {**cache_env, "AWS_ENDPOINT_URL": f"http://{NAME}:{port}", "http_proxy": proxy.url}
    proc = _rq("preload", f"s3://{bucket}/big/", env=env)
    lines = proc.stderr.decode().strip().splitlines()
    assert proc.returncode == 6, lines  # unreachable: re-run to continue
    assert len(lines) == 1, lines
    assert f"cannot reach the proxy {proxy.url} (HTTP_PROXY)" in lines[0], lines
    assert "gaierror" not in lines[0] and "HTTP_PROXY / HTTPS_PROXY and NO_PROXY" in lines[0], lines


def test_a_proxy_that_wants_credentials_is_an_auth_error_naming_it(
    big: tuple[str, str, bytes], proxies: Any, services: Any, aws_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from test_ranged import Collector

    from cache.errors import AuthError
    from cache.s3 import S3, S3Settings

    bucket, key, _ = big
    proxy = proxies(auth=("px", "secret"))
    monkeypatch.setenv("HTTP_PROXY", f"http://px:wrong@127.0.0.1:{proxy.port}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    got = Collector(1 << 20)
    S3(S3Settings(endpoint_url=services.s3_endpoint)).ranged.start(
        bucket, key, (0, (1 << 20) - 1), None, got.sink, got.on_done
    )
    got.wait()
    assert isinstance(got.error, AuthError), got.error
    assert f"the proxy {proxy.url} (HTTP_PROXY) refused" in str(got.error) and "407" in str(got.error)
    assert proxy.refused == 1  # not retried


# --- https: CONNECT, TLS with the store inside the tunnel -------------------------------------


def _ca_for(name: str, directory: Path) -> tuple[Path, ssl.SSLContext]:
    """A CA (its certificate file) and a server context with a certificate for `name` it signed."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    day = datetime.timedelta(days=1)

    def subject(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(subject("rq px CA"))
        .issuer_name(subject("rq px CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - day)
        .not_valid_after(now + day)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    leaf = (
        x509.CertificateBuilder()
        .subject_name(subject(name))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - day)
        .not_valid_after(now + day)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    ca_file, cert_file, key_file = directory / "ca.pem", directory / "leaf.pem", directory / "leaf.key"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_file.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    return ca_file, context


def test_a_big_object_lands_through_a_connect_tunnel_over_https(
    big: tuple[str, str, bytes],
    cache_env: dict[str, str],
    proxies: Any,
    proxy_factory: Any,
    tmp_path: Path,
) -> None:
    bucket, key, body = big
    ca_file, context = _ca_for(NAME, tmp_path / "pki")
    front = proxy_factory(tls=context)  # TLS in front of SeaweedFS, certificate for NAME
    proxy = proxies(auth=("px", "s3cr3t"))
    env = {
        **cache_env,
        "AWS_ENDPOINT_URL": f"https://{NAME}:{front.port}",
        "AWS_CA_BUNDLE": str(ca_file),
        "HTTPS_PROXY": f"http://px:s3cr3t@127.0.0.1:{proxy.port}",
        "HTTP_PROXY": "http://127.0.0.1:9",  # not the one for an https endpoint
    }
    proc = _rq("preload", f"s3://{bucket}/big/", env=env)
    assert proc.returncode == 0, proc.stderr.decode()
    tunnels = proxy.methods("CONNECT")
    assert len(tunnels) >= 3 and {t[1] for t in tunnels} == {f"{NAME}:{front.port}"}, proxy.requests
    assert proxy.refused == 0 and len(tunnels) == len(proxy.requests)
    assert _cached(cache_env, f"s3://{bucket}/{key}") == body


def test_the_tls_probe_shakes_hands_through_the_proxy(
    proxies: Any, proxy_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A certificate the system does not trust, behind the proxy: the probe's verdict in one
    handshake through a tunnel (it was None: NAME did not resolve, so no early exit 4)."""
    from cache.errors import TlsError
    from cache.tls import handshake_failure

    _, context = _ca_for(NAME, tmp_path / "pki")
    front = proxy_factory(tls=context)
    proxy = proxies()
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    for name in ("NO_PROXY", "no_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    failure = handshake_failure(NAME, front.port, None, f"https://{NAME}:{front.port}", 5.0)
    assert isinstance(failure, TlsError), failure
    assert proxy.methods("CONNECT") == [("CONNECT", f"{NAME}:{front.port}", "")]


# --- which proxy: botocore's choice ------------------------------------------------------------


@pytest.mark.parametrize(
    "no_proxy",
    [
        "",
        "*",
        "s3.rq-px.internal",
        ".rq-px.internal",
        "rq-px.internal",
        "px.internal",  # not on a dot boundary of "rq-px.internal": proxied
        "other.example, S3.RQ-PX.INTERNAL ",
        "s3.rq-px.internal:18333",
        "s3.rq-px.internal:1",
        "127.0.0.0/8",  # an IP range: botocore (urllib) does not read those
        "localhost,*",
    ],
)
@pytest.mark.parametrize("scheme", ["http", "https"])
def test_the_proxy_and_no_proxy_are_botocores(
    scheme: str, no_proxy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from botocore.utils import get_environ_proxies

    from cache.proxy import proxy_for

    for name in list(os.environ):
        if name.lower().endswith("_proxy"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HTTP_PROXY", "http://u:p%40ss@proxy.example:3128")
    monkeypatch.setenv("https_proxy", "proxy2.example:8080")  # no scheme: http://, as botocore
    monkeypatch.setenv("NO_PROXY", no_proxy)
    netloc = f"{NAME}:18333"
    want = get_environ_proxies(f"{scheme}://{netloc}").get(scheme)
    got = proxy_for(scheme, netloc)
    if want is None:
        assert got is None
        return
    assert got is not None
    parts = urlsplit(want if "://" in want else f"http://{want}")
    assert (got.host, got.port) == (parts.hostname, parts.port)
    if scheme == "http":  # botocore's Proxy-Authorization: the decoded user:password
        assert got.authorization == "Basic " + base64.b64encode(b"u:p@ss").decode()
        assert "p%40ss" not in got.text and "u:" not in got.text
    else:
        assert got.authorization is None


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("socks5://127.0.0.1:1080", "socks5:// proxy"),
        ("https://proxy.example:3129", "reached over TLS"),
        ("http://proxy.example:http", "cannot use the proxy URL in HTTP_PROXY"),
    ],
)
def test_a_proxy_url_rq_cannot_use_is_a_usage_error(
    url: str, said: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cache.errors import BadSourceError
    from cache.proxy import proxy_for

    for name in list(os.environ):
        if name.lower().endswith("_proxy"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HTTP_PROXY", url)
    with pytest.raises(BadSourceError, match=said):
        proxy_for("http", "s3.example:9000")
