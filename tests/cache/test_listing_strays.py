"""Keys a store lists that the source does not name: outside the prefix asked for, or the same key
twice (a page handed out again under a new token). They were fetched and cached (a key outside
the prefix under a mangled relative name) and duplicates fetched and counted twice."""

from __future__ import annotations

from pathlib import Path

import pytest
from s3fake import FakeS3, list_page, object_reply

from cache import Cache
from cache import events as ev

A, B = b"first\n", b"second\n"


@pytest.fixture(autouse=True)
def objects(store: FakeS3) -> None:
    store.objects = {
        "p/a": object_reply(A),
        "p/b": object_reply(B),
        "/etc/passwdx": object_reply(A),
        "outside/x": object_reply(B),
        "p2/c": object_reply(A),
    }


def preload(store: FakeS3, tmp_path: Path, source: str) -> tuple[object, list[ev.Event], list[str]]:
    events: list[ev.Event] = []
    with Cache(tmp_path / "c", ram_dir=tmp_path / "ram", endpoint_url=store.endpoint) as c:
        result = c.preload([source], on_event=events.append)
        urls = sorted(e.url for e in c.entries())
    return result, events, urls


@pytest.mark.parametrize("source", ["s3://b/p/", "s3://b/p"])
def test_keys_outside_the_prefix_are_ignored_and_reported(store: FakeS3, tmp_path: Path, source: str) -> None:
    store.pages = {None: list_page({"/etc/passwdx": A, "outside/x": B, "p/a": A, "p2/c": A})}
    result, events, urls = preload(store, tmp_path, source)
    assert urls == ["s3://b/p/a"]
    assert [r for r in store.requests if r.startswith("GET")] == ["GET p/a"]
    ignored = sorted(e.url for e in events if isinstance(e, ev.Ignored))
    outside = ["s3://b//etc/passwdx", "s3://b/outside/x"]
    # (for s3://b/p, p2/c is a sibling the raw prefix p takes too: left out without a word)
    if source.endswith("/"):
        outside.append("s3://b/p2/c")
    assert ignored == outside
    assert result.ignored == len(outside) and result.failed == []  # type: ignore[attr-defined]


def test_a_key_listed_twice_is_fetched_once(store: FakeS3, tmp_path: Path) -> None:
    store.pages = {None: list_page({"p/a": A, "p/b": B}, token="T2"), "T2": list_page({"p/a": A, "p/b": B})}
    result, events, urls = preload(store, tmp_path, "s3://b/p/")
    assert urls == ["s3://b/p/a", "s3://b/p/b"]
    assert sorted(r for r in store.requests if r.startswith("GET")) == ["GET p/a", "GET p/b"]
    assert result.objects == 2 and result.ignored == 2  # type: ignore[attr-defined]
    assert {e.reason for e in events if isinstance(e, ev.Ignored)} == {"listed twice by the store"}
