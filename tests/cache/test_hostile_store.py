"""An S3 endpoint that answers badly: odd error bodies, a listing that never ends, a bad endpoint URL.

The endpoint here is a tiny HTTP server of the test's own (fault injection, like faultproxy.py): no
real S3 server sends these replies, and rq must still end with one clear line and its exit code."""

from __future__ import annotations

import http.server
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rqtest import http_on_loopback, run_rq

import cache.origins as origins_mod
from cache import Cache
from cache.fetcher import Fetcher

WEIRD_403 = b'<?xml version="1.0" encoding="x-no-such-encoding"?><Error><Code>AccessDenied</Code></Error>'
ONE_KEY = (
    b'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult><IsTruncated>false</IsTruncated>'
    b"<Contents><Key>k/1</Key><Size>5</Size><ETag>&quot;x&quot;</ETag></Contents></ListBucketResult>"
)
ENDLESS = (
    b'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult><IsTruncated>true</IsTruncated>'
    b"<NextContinuationToken>same</NextContinuationToken>"
    b"<Contents><Key>k/1</Key><Size>5</Size><ETag>&quot;x&quot;</ETag></Contents></ListBucketResult>"
)
ENV = {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_REGION": "us-east-1", "CI": "1"}


class Store(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    mode = "list-denied"  # or "get-denied", "endless"

    def do_GET(self) -> None:
        listing = "list-type=2" in self.path
        if self.mode == "list-denied" or (self.mode == "get-denied" and not listing):
            self._reply(403, WEIRD_403)
        elif self.mode == "endless":
            self._reply(200, ENDLESS)
        else:
            self._reply(200, ONE_KEY)

    def do_HEAD(self) -> None:
        self.send_response(403)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def store() -> Iterator[tuple[str, type[Store]]]:
    handler = type("Handler", (Store,), {})
    with http_on_loopback(handler) as port:
        yield f"http://127.0.0.1:{port}", handler


@pytest.mark.parametrize("mode", ["list-denied", "get-denied"])
def test_an_error_body_python_cannot_decode_is_still_an_auth_error(
    store: tuple[str, type[Store]], tmp_path: Path, mode: str
) -> None:
    endpoint, handler = store
    handler.mode = mode
    # (it used to wait for ever on the lost callback: run_rq's timeout ends that as a failure)
    proc = run_rq(
        "preload", "s3://b/k/", "--endpoint-url", endpoint, "--cache-dir", str(tmp_path / "c"),
        env=ENV, timeout=60,
    )  # fmt: skip
    err = proc.stderr.decode()
    assert proc.returncode == 4, err  # AUTH: a 403 is a 403 whatever its body says
    assert "Traceback" not in err and "Exception ignored" not in err


def test_a_listing_that_repeats_its_token_stops_with_a_clear_error(
    store: tuple[str, type[Store]], tmp_path: Path
) -> None:
    endpoint, handler = store
    handler.mode = "endless"
    proc = run_rq(
        "preload", "s3://b/k/", "--endpoint-url", endpoint, "--cache-dir", str(tmp_path / "c"),
        env=ENV, timeout=60,
    )  # fmt: skip
    err = proc.stderr.decode()
    assert proc.returncode != 0
    assert "repeats itself" in err and len(err.strip().splitlines()) <= 2, err


@pytest.mark.parametrize("url", ["http://[bad", "http://127.0.0.1:99999", "ftp://host"])
def test_a_malformed_endpoint_url_is_a_usage_error(tmp_path: Path, url: str) -> None:
    proc = run_rq(
        "preload", "s3://b/k/", "--endpoint-url", url, "--cache-dir", str(tmp_path / "c"), env=ENV, timeout=60
    )
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert "endpoint URL must be" in err and "Traceback" not in err


def test_ctrl_c_while_starting_requests_stops_the_run(
    aws_env: dict[str, str], s3_client: Any, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(20):
        s3_client.put_object(Bucket=bucket, Key=f"i/{i}", Body=b"x" * 100)
    fetch = origins_mod.S3Origin.fetch
    calls = 0

    def interrupted(self: Any, *args: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 5:
            raise KeyboardInterrupt
        return fetch(self, *args)

    monkeypatch.setattr(origins_mod.S3Origin, "fetch", interrupted)
    c = Cache(tmp_path / "c", ram_dir=tmp_path / "ram")
    try:
        with pytest.raises(KeyboardInterrupt) as raised:
            c.preload([f"s3://{bucket}/i/"])
        # no 30 s wait for a request that never started: the interrupted start was booked, so the
        # wind-down ended with nothing in flight (read in Fetcher.run's frame, not off a clock)
        frames = []
        tb = raised.tb
        while tb is not None:
            frames.append(tb.tb_frame)
            tb = tb.tb_next
        (run,) = [f for f in frames if f.f_code is Fetcher.run.__code__]
        assert run.f_locals["inflight"] == 0
        assert not list((tmp_path / "c" / "tmp").iterdir())  # nothing half-written left
    finally:
        c.close()
