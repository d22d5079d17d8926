"""Every object is checked as it lands: its size against the listing, its bytes against the
x-amz-checksum-crc32 header or, without one, the plain-MD5 ETag; a mismatch is a failure and
nothing of it stays in the cache.

The store here is a tiny HTTP server of the test's own (fault injection, as in test_hostile_store):
no real S3 server serves a body that disagrees with its own listing or checksum, which is exactly
what a flipped bit in transit or an object replaced between LIST and GET looks like."""

from __future__ import annotations

import base64
import hashlib
import http.server
import os
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cache import Cache

GOOD = os.urandom(300_000)
OTHER = bytes(b ^ 0xFF for b in GOOD[:1000]) + GOOD[1000:]


def crc(body: bytes) -> str:
    return base64.b64encode(zlib.crc32(body).to_bytes(4, "big")).decode()


def md5(body: bytes) -> str:
    return hashlib.md5(body).hexdigest()


# key -> (size in the listing, ETag in the listing and the reply, body served, CRC32 header or None)
OBJECTS: dict[str, tuple[int, str, bytes, str | None]] = {
    "crc-ok": (len(GOOD), md5(GOOD), GOOD, crc(GOOD)),
    "crc-bad": (len(GOOD), md5(GOOD), OTHER, crc(GOOD)),
    "md5-ok": (len(GOOD), md5(GOOD), GOOD, None),
    "md5-bad": (len(GOOD), md5(GOOD), OTHER, None),
    # the body the GET brings is longer / shorter than the listed size (its own checksum right)
    "longer": (len(GOOD) - 7, "x", GOOD, crc(GOOD)),
    "shorter": (len(GOOD) + 7, "x", GOOD, crc(GOOD)),
    "empty": (0, md5(b""), b"", None),
}


def listing(keys: list[str]) -> bytes:
    items = "".join(
        f"<Contents><Key>k/{key}</Key><Size>{OBJECTS[key][0]}</Size><ETag>&quot;{OBJECTS[key][1]}&quot;</ETag></Contents>"
        for key in keys
    )
    return (
        '<?xml version="1.0" encoding="UTF-8"?><ListBucketResult><IsTruncated>false</IsTruncated>'
        f"{items}</ListBucketResult>"
    ).encode()


class Store(http.server.BaseHTTPRequestHandler):
    """Lists every key of OBJECTS under k/ and serves each as OBJECTS says."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if "list-type=2" in self.path:
            body, head = listing(sorted(OBJECTS)), ["Content-Type: application/xml"]
        else:
            _, etag, body, checksum = OBJECTS[self.path.rsplit("/", 1)[-1]]
            head = [f'ETag: "{etag}"'] + ([f"x-amz-checksum-crc32: {checksum}"] if checksum else [])
        lines = ["HTTP/1.1 200 OK", *head, f"Content-Length: {len(body)}", "", ""]
        self.wfile.write("\r\n".join(lines).encode() + body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    for name, value in {
        "AWS_ACCESS_KEY_ID": "k",
        "AWS_SECRET_ACCESS_KEY": "s",
        "AWS_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Store) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        yield f"http://127.0.0.1:{server.server_address[1]}"
        server.shutdown()


def leftovers(cache_dir: Path) -> list[str]:
    return sorted(p.name for p in (cache_dir / "tmp").iterdir())


def test_bodies_that_disagree_with_the_listing_or_the_checksum_never_land(
    endpoint: str, tmp_path: Path
) -> None:
    c = Cache(tmp_path / "c", ram_dir=tmp_path / "ram", endpoint_url=endpoint)
    try:
        result = c.preload(["s3://b/k/"])
        failed = {f.url.rsplit("/", 1)[-1]: f for f in result.failed}
        assert sorted(failed) == ["crc-bad", "longer", "md5-bad", "shorter"], failed
        assert {f.kind for f in failed.values()} == {"verify"}
        assert "crc32 mismatch" in failed["crc-bad"].message
        assert "MD5 does not match" in failed["md5-bad"].message
        assert f"got {len(GOOD)} bytes, expected {len(GOOD) - 7}" in failed["longer"].message
        assert f"got {len(GOOD)} bytes, expected {len(GOOD) + 7}" in failed["shorter"].message
        entries = {e.url.rsplit("/", 1)[-1]: e for e in c.entries()}
        assert sorted(entries) == ["crc-ok", "empty", "md5-ok"]
        assert entries["crc-ok"].verified_by == "size+crc32"
        assert entries["md5-ok"].verified_by == "size+md5"
        assert entries["empty"].verified_by == "size+md5"
        for key, body in (("crc-ok", GOOD), ("md5-ok", GOOD), ("empty", b"")):
            with c.open(f"s3://b/k/{key}") as f:
                assert f.read() == body
        assert leftovers(tmp_path / "c") == []  # the refused ones left nothing behind
        assert c.usage()["disk"]["held"] == 0
    finally:
        c.close()
