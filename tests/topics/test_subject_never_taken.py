"""A JetStream subject the stream holds nothing on and whose subjects take none of it (a typo:
`S/other.x` for a stream of `S.a.>`) replayed nothing with exit 0, and `rq tail` waited on it for
good. It is exit 3 naming what the stream takes; a subject it could take, one still stored from
before its subjects changed, and a stream fed by sources are read as before. Real nats-server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from jskit import MakeStream, made_streams, produce
from rqtest import js_call, run_rq

pytestmark = pytest.mark.integration


@pytest.fixture
def make(services: Any) -> Iterator[MakeStream]:
    with made_streams(services.nats_url, "NT") as make:
        yield make


def test_a_subject_the_stream_never_takes_is_exit_3(services: Any, make: MakeStream) -> None:
    name = make(["{name}.a.>"])
    produce(f"{services.nats_url}/{name}/{name}.a.x", b"1\n2\n")
    for command in ("replay", "tail"):
        r = run_rq(command, f"{services.nats_url}/{name}/other.x", timeout=60)
        err = r.stderr.decode()
        assert r.returncode == 3, err
        assert f"{name}.a.>" in err and "check the subject" in err and len(err.strip().splitlines()) == 1, err
    assert run_rq("replay", f"{services.nats_url}/{name}/{name}.a.x").stdout.count(b"\n") == 2
    r = run_rq("replay", f"{services.nats_url}/{name}/{name}.*.zzz")  # it could: nothing yet
    assert r.returncode == 0 and r.stdout == b"", r.stderr


def test_a_subject_stored_before_the_streams_subjects_changed_is_read(
    services: Any, make: MakeStream
) -> None:
    name = make(["{name}.old"])
    produce(f"{services.nats_url}/{name}/{name}.old", b"1\n")

    async def move(js: Any) -> None:
        config = (await js.stream_info(name)).config
        config.subjects = [f"{name}.new"]
        await js.update_stream(config)

    js_call(services.nats_url, move)
    r = run_rq("replay", f"{services.nats_url}/{name}/{name}.old")
    assert r.returncode == 0 and r.stdout.count(b"\n") == 1, r.stderr


def test_a_stream_fed_by_sources_is_not_judged_by_its_own_subjects(services: Any, make: MakeStream) -> None:
    from nats.js.api import StreamSource

    origin = make(["{name}.in"])
    copy = make([], sources=[StreamSource(name=origin)])
    r = run_rq("replay", f"{services.nats_url}/{copy}/{origin}.in")
    assert r.returncode == 0, r.stderr
