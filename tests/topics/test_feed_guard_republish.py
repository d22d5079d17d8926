"""The `--to-topic` self-feed guard follows a stream's republish: a message stored in a stream is
published again under its republish destination, and stored by whichever stream captures that.
On a nats-server of the test's own (ports 23400-23449).

The old guard walked only mirrors and sources: following F while copying into T, whose republish
sends every stored message on to F (directly, or through a stream F sources), copied its own
output back (20 copies at --count 20, exit 0)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from jskit import (
    MakeStream,
    follow_copy,
    made_streams,
    own_nats_server,
    produce,
    refused_as_loop,
    republish,
    values,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    store = tmp_path / "server"
    store.mkdir()
    with own_nats_server(store, range(23400, 23450)) as url:
        yield url


def _republish(server: str, name: str, src: str, dest: str, headers_only: bool = False) -> None:
    republish(server, name, src, dest, headers_only)


@pytest.fixture
def stream(server: str) -> Iterator[MakeStream]:
    with made_streams(server, "rp") as make:
        yield make


def test_a_republish_into_the_followed_stream_is_a_loop(
    server: str, stream: MakeStream, tmp_path: Path
) -> None:
    followed = stream(subjects=["{name}.>"])
    target = stream(subjects=["{name}.in"])
    _republish(server, target, f"{target}.in", f"{followed}.got")
    produce(f"{server}/{target}/{target}.in", b"1\n")
    assert values(f"{server}/{followed}") == [b"1"]  # the republish really lands there
    r = follow_copy(f"{server}/{followed}", f"{server}/{target}/{target}.in", tmp_path)
    assert refused_as_loop(r), r.stderr
    assert values(f"{server}/{target}") == [b"1"]  # nothing was copied


def test_a_republish_into_a_stream_the_followed_one_sources_is_a_loop(
    server: str, stream: MakeStream, tmp_path: Path
) -> None:
    from nats.js.api import StreamSource

    middle = stream(subjects=["{name}.>"])
    followed = stream(subjects=[], sources=[StreamSource(name=middle)])
    target = stream(subjects=["{name}.in"])
    _republish(server, target, f"{target}.in", f"{middle}.x", headers_only=True)
    produce(f"{server}/{target}/{target}.in", b"1\n")
    r = follow_copy(f"{server}/{followed}", f"{server}/{target}/{target}.in", tmp_path)
    assert refused_as_loop(r), r.stderr


def test_a_republish_that_leaves_the_subject_out_is_no_loop(
    server: str, stream: MakeStream, tmp_path: Path
) -> None:
    """Control: the republish takes only T.other, and a copy into T.in never reaches F."""
    followed = stream(subjects=["{name}.>"])
    target = stream(subjects=["{name}.in", "{name}.other"])
    source = stream(subjects=["{name}.x"])
    _republish(server, target, f"{target}.other", f"{followed}.got")
    produce(f"{server}/{source}/{source}.x", b"1\n2\n")
    r = follow_copy(f"{server}/{source}", f"{server}/{target}/{target}.in", tmp_path)
    assert r.returncode == 0, r.stderr
    r = follow_copy(f"{server}/{followed}", f"{server}/{target}/{target}.in", tmp_path)
    assert r.returncode == 0, r.stderr
