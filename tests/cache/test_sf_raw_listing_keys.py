"""ListObjectsV2 keys are url-decoded only when the reply echoes <EncodingType>url</EncodingType>
(as botocore does). A store that ignores encoding-type=url sends raw keys: decoding them anyway
made `plus+x.bin` and `plus x.bin` one key (listed twice) and fetched `pct%41.bin` as `pctA.bin`.
A unit test of parse_list_page on both reply shapes, and a preload from real SeaweedFS through a
tiny proxy that strips the element and sends the keys raw."""

from __future__ import annotations

import http.client
import http.server
import re
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rqtest import http_on_loopback

from cache import Cache
from cache.s3 import parse_list_page

KEYS = ["d/plus+x.bin", "d/plus x.bin", "d/pct%41.bin", "d/plain.bin"]


def _page(keys: list[str], encoding: bool) -> bytes:
    def key(k: str) -> str:
        return urllib.parse.quote_plus(k, safe="/") if encoding else k

    contents = "".join(
        f'<Contents><Key>{key(k)}</Key><Size>3</Size><ETag>"e"</ETag></Contents>' for k in keys
    )
    enc = "<EncodingType>url</EncodingType>" if encoding else ""
    return (
        '<?xml version="1.0" encoding="UTF-8"?>'
        '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        f"<Name>b</Name>{enc}<IsTruncated>false</IsTruncated>{contents}</ListBucketResult>"
    ).encode()


@pytest.mark.parametrize("encoding", [True, False])
def test_keys_are_decoded_only_when_the_reply_says_so(encoding: bool) -> None:
    items, token = parse_list_page(_page(KEYS, encoding))
    assert token is None
    assert [i[0] for i in items] == KEYS


@pytest.fixture
def raw_keys_proxy(services: Any) -> Iterator[str]:
    """In front of SeaweedFS: listings come back with their keys decoded and no EncodingType."""
    upstream = int(services.s3_endpoint.rsplit(":", 1)[1])

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _relay(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            conn = http.client.HTTPConnection("127.0.0.1", upstream, timeout=30)
            conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for k, v in self.headers.items():
                conn.putheader(k, v)
            conn.endheaders(body or None)
            resp = conn.getresponse()
            data = resp.read()
            if "list-type=2" in self.path:
                data = data.replace(b"<EncodingType>url</EncodingType>", b"")
                data = re.sub(
                    rb"<Key>(.*?)</Key>",
                    lambda m: b"<Key>" + urllib.parse.unquote_plus(m.group(1).decode()).encode() + b"</Key>",
                    data,
                )
            self.send_response(resp.status)
            for k, v in resp.getheaders():
                if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
            conn.close()

        do_GET = do_HEAD = do_PUT = do_POST = _relay

        def log_message(self, *args: Any) -> None:
            pass

    with http_on_loopback(Handler) as port:
        yield f"http://127.0.0.1:{port}"


@pytest.mark.integration
def test_preload_from_a_store_that_sends_raw_keys(
    s3_client: Any, bucket: str, aws_env: dict[str, str], tmp_path: Path, ram_dir: Path, raw_keys_proxy: str
) -> None:
    bodies = {k: f"body of {k}".encode() for k in KEYS}
    for k, b in bodies.items():
        s3_client.put_object(Bucket=bucket, Key=k, Body=b)
    with Cache(tmp_path / "c", ram_dir=ram_dir, endpoint_url=raw_keys_proxy) as c:
        result = c.preload([f"s3://{bucket}/d/"])
        assert result.failed == []
        for k, b in bodies.items():
            assert c.read_bytes(f"s3://{bucket}/{k}") == b
