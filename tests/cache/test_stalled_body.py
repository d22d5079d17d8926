"""A GET whose body stops after a few bytes, trickles, or comes slowly but steadily. The CRT hands
a whole-object GET's headers and body over only at its end, so the watchdog cannot see a body
arrive: a stalled one was reported as "accepted the connection but sent nothing", retried five
times (~157 s with the real 30 s) and failed as `origin` (exit 1); a slow but steady one was
cancelled after 30 s whatever its size."""

from __future__ import annotations

from pathlib import Path

import pytest
from cachekit import payload
from s3fake import FakeS3, list_page

import cache.watchdog
from cache import Cache


@pytest.fixture(autouse=True)
def quick_watchdog(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache.watchdog, "SILENCE_S", 1.0)  # 30 s in real life


def test_a_body_that_stops_fails_as_unreachable_after_three_attempts(store: FakeS3, tmp_path: Path) -> None:
    body = payload(1, 1000)
    store.pages = {None: list_page({"p/a": body})}
    store.objects = {"p/a": store.slow_body(body, sent=3)}
    with Cache(tmp_path / "c", ram_dir=tmp_path / "ram", endpoint_url=store.endpoint) as c:
        result = c.preload(["s3://b/p/"])
        assert c.entries() == []
    [failure] = result.failed
    # unreachable: rq preload's exit 6 (re-run to continue), as for a store that went away
    assert failure.kind == "unreachable", failure
    assert "did not send s3://b/p/a (1000 bytes)" in failure.message
    assert "sent nothing" not in failure.message  # (bytes may well have come)
    assert store.requests.count("GET p/a") == 3  # each attempt costs the watchdog's whole wait


def test_a_slow_but_steady_body_lands(store: FakeS3, tmp_path: Path) -> None:
    # 1.5 MiB at 512 KiB/s: 3 s, three times the silence allowed, within the size's allowance
    body = payload(2, 1536 << 10)
    store.pages = {None: list_page({"p/a": body})}
    store.objects = {"p/a": store.slow_body(body, sent=0, rate=512 << 10)}
    with Cache(tmp_path / "c", ram_dir=tmp_path / "ram", endpoint_url=store.endpoint) as c:
        result = c.preload(["s3://b/p/"])
        assert result.failed == [] and result.objects == 1
        assert store.requests.count("GET p/a") == 1
        assert c.read_bytes("s3://b/p/a") == body
