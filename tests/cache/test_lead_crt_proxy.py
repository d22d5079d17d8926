"""The CRT's side of a proxy (listings, HEADs, small objects): a proxy that is down, or that wants a
password, is named as such. px made big objects' pieces name it; the CRT's errors still said
"cannot reach http://STORE (AWS_IO_SOCKET_CONNECTION_REFUSED) — check --endpoint-url" (exit 6), and
a 407 "HTTP 407 … the store kept failing" (exit 6), pointing at the store."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from typing import Any
from urllib.parse import urlsplit

import pytest
from test_px_proxy import NAME, ForwardProxy, _clean

pytestmark = pytest.mark.integration


def _preload(env: dict[str, str], url: str = "s3://rq-lead-proxy/any/") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "rqcli", "preload", url],
        env={**_clean(dict(os.environ)), "CI": "1", **env},
        capture_output=True,
        timeout=60,
        check=False,
    )


def test_a_proxy_down_at_the_listing_is_named(cache_env: dict[str, str], services: Any) -> None:
    with socket.socket() as held:  # bound, never listening: connections to it are refused
        held.bind(("127.0.0.1", 0))
        proxy = f"http://127.0.0.1:{held.getsockname()[1]}"
        port = urlsplit(services.s3_endpoint).port
        done = _preload({**cache_env, "AWS_ENDPOINT_URL": f"http://{NAME}:{port}", "HTTP_PROXY": proxy})
    lines = done.stderr.decode().strip().splitlines()
    assert done.returncode == 6 and len(lines) == 1, lines
    assert f"cannot reach the proxy {proxy} (HTTP_PROXY)" in lines[0], lines
    assert "HTTP_PROXY / HTTPS_PROXY and NO_PROXY" in lines[0] and "--endpoint-url" not in lines[0], lines


def test_a_proxy_that_wants_a_password_at_the_listing_is_an_auth_error(
    cache_env: dict[str, str], services: Any
) -> None:
    proxy = ForwardProxy(auth=("px", "secret"))
    try:
        port = urlsplit(services.s3_endpoint).port
        done = _preload({**cache_env, "AWS_ENDPOINT_URL": f"http://{NAME}:{port}", "HTTP_PROXY": proxy.url})
    finally:
        proxy.stop()
    lines = done.stderr.decode().strip().splitlines()
    assert done.returncode == 4 and len(lines) == 1, lines
    assert f"the proxy {proxy.url} (HTTP_PROXY) refused" in lines[0] and "407" in lines[0], lines
    assert "user:password@ in HTTP_PROXY" in lines[0], lines


@pytest.mark.parametrize(
    "proxy", ["socks5://127.0.0.1:1", "https://127.0.0.1:1", "http://127.0.0.1:notaport"]
)
def test_a_proxy_url_rq_cannot_use_is_exit_2_at_the_listing(
    cache_env: dict[str, str], services: Any, proxy: str
) -> None:
    """The CRT fails on such a URL its own way first: 'cannot reach ENDPOINT … check --endpoint-url'
    (exit 6) or AWS_ERROR_MALFORMED_INPUT_STRING 'the store kept failing' (exit 6)."""
    done = _preload({**cache_env, "AWS_ENDPOINT_URL": services.s3_endpoint, "HTTP_PROXY": proxy})
    lines = done.stderr.decode().strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, lines
    assert "HTTP_PROXY" in lines[0] and "--endpoint-url" not in lines[0], lines
