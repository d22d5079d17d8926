"""The `--to-topic` self-feed guard where rq may not list the account's streams (its user is
denied `$JS.API.STREAM.LIST`): it walks the streams it can look at (the followed stream's upstream,
the stream the server names for a republished subject), and refuses a copy whose records it
cannot follow to the end (a republished subject whose stream it may not look at, one a
transform function could turn into any subject) as a possible loop, rather than risk one.
On a nats-server of the test's own (ports 20400-20449), an admin making the streams and a user
`lim` running rq; `nonames` may not ask which stream captures a subject ($JS.API.STREAM.NAMES)
either, which the old guard turned into exit 4 for any JetStream-to-JetStream follow copy.

Also: a target stream that does not exist yet (the sink makes it) but that the followed stream
already sources (nats-server lets a source name a stream to come) was no loop to the old guard
(no stream captured the subject), and the copy ran: its records came back into the followed
stream once the server's source retry found the new stream."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
from rqtest import js_call, run_rq

pytestmark = pytest.mark.integration

_HIDDEN = "HIDDEN"  # a stream lim may not look at


def _config(deny: list[str]) -> str:
    denied = ", ".join(f'"{d}"' for d in deny)
    return (
        "accounts {\n"
        "  A {\n"
        "    jetstream: enabled\n"
        "    users: [\n"
        '      {user: admin, password: "pw-a"}\n'
        f'      {{user: lim, password: "pw-l", permissions: {{publish: {{allow: [">"], deny: [{denied}]}}, '
        'subscribe: ">"}}\n'
        f'      {{user: nonames, password: "pw-n", permissions: {{publish: {{allow: [">"], '
        f'deny: [{denied}, "$JS.API.STREAM.NAMES"]}}, subscribe: ">"}}}}\n'
        "    ]\n"
        "  }\n"
        "}\n"
    )


_DENY = ["$JS.API.STREAM.LIST", f"$JS.API.STREAM.INFO.{_HIDDEN}"]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    """host:port; `admin` and `lim` (no stream listing, no look at HIDDEN) in one account."""
    store = tmp_path / "server"
    store.mkdir()
    with own_nats_server(store, range(20400, 20450), _config(_DENY)) as url:
        yield url.removeprefix("nats://")


@pytest.fixture
def stream(server: str) -> Iterator[MakeStream]:
    with made_streams(f"nats://admin:pw-a@{server}", "ul") as make:
        yield make


def _republish(server: str, name: str, src: str, dest: str) -> None:
    republish(f"nats://admin:pw-a@{server}", name, src, dest)


def _copy(source: str, target: str, tmp_path: Path) -> subprocess.CompletedProcess[bytes]:
    """A follow copy that is no loop, of the 2 records there: ends at --count 2, not at a quiet."""
    return run_rq(
        "replay", source, "--from", "start", "-f", "--to-topic", target, "--count", "2", "--timeout", "5",
        "-q", env={"RQ_TOPICS_DIR": str(tmp_path)}, timeout=30,
    )  # fmt: skip


def _lim(server: str, path: str) -> str:
    return f"nats://lim:pw-l@{server}/{path}"


def test_a_republish_into_the_followed_stream_is_found_without_listing(
    server: str, stream: MakeStream, tmp_path: Path
) -> None:
    followed = stream(subjects=["{name}.>"])
    target = stream(subjects=["{name}.in"])
    _republish(server, target, f"{target}.in", f"{followed}.got")
    r = follow_copy(_lim(server, followed), _lim(server, f"{target}/{target}.in"), tmp_path)
    assert refused_as_loop(r), r.stderr


def test_a_republish_into_a_stream_rq_may_not_look_at_is_refused(
    server: str, stream: MakeStream, tmp_path: Path
) -> None:
    """HIDDEN might source the followed stream: rq cannot tell, so the copy is refused."""
    followed = stream(subjects=["{name}.>"])
    target = stream(subjects=["{name}.in"])
    from nats.js.api import StreamConfig

    async def hidden(js: Any) -> None:
        await js.add_stream(StreamConfig(name=_HIDDEN, subjects=["hid.>"]))

    js_call(f"nats://admin:pw-a@{server}", hidden)
    _republish(server, target, f"{target}.in", "hid.x")
    r = follow_copy(_lim(server, followed), _lim(server, f"{target}/{target}.in"), tmp_path)
    assert refused_as_loop(r), r.stderr
    assert values(f"nats://admin:pw-a@{server}/{target}") == []  # nothing was copied


def test_a_republish_through_a_transform_function_is_refused(
    server: str, stream: MakeStream, tmp_path: Path
) -> None:
    """A partition() in the republish's dest may make any subject: refused as a possible loop."""
    followed = stream(subjects=["{name}.>"])
    target = stream(subjects=["{name}.*"])
    _republish(server, target, f"{target}.*", "part.{{partition(3,1)}}")
    r = follow_copy(_lim(server, followed), _lim(server, f"{target}/{target}.in"), tmp_path)
    assert refused_as_loop(r), r.stderr


def test_a_republish_into_an_unrelated_stream_is_no_loop(
    server: str, stream: MakeStream, tmp_path: Path
) -> None:
    """Control: the republished subject's stream is one lim may look at, and it reaches nothing
    the follow reads: the copy runs (all 2 records, exit 0 at the quiet)."""
    followed = stream(subjects=["{name}.>"])
    target = stream(subjects=["{name}.in"])
    other = stream(subjects=["{name}.got"])
    _republish(server, target, f"{target}.in", f"{other}.got")
    produce(_lim(server, f"{followed}/{followed}.a"), b"1\n2\n")
    r = _copy(_lim(server, followed), _lim(server, f"{target}/{target}.in"), tmp_path)
    assert r.returncode == 0, r.stderr
    assert values(_lim(server, target)) == [b"1", b"2"]
    assert values(_lim(server, other)) == [b"1", b"2"]  # the republish took them on


def test_a_copy_by_a_user_who_may_not_ask_for_stream_names_runs(
    server: str, stream: MakeStream, tmp_path: Path
) -> None:
    """Old: exit 4, 'Permissions Violation for Publish to "$JS.API.STREAM.NAMES"'."""
    followed = stream(subjects=["{name}.>"])
    target = stream(subjects=["{name}.in"])
    produce(_lim(server, f"{followed}/{followed}.a"), b"1\n2\n")
    url = f"nats://nonames:pw-n@{server}"
    r = _copy(f"{url}/{followed}", f"{url}/{target}/{target}.in", tmp_path)
    assert r.returncode == 0, r.stderr
    assert values(_lim(server, target)) == [b"1", b"2"]


@pytest.mark.parametrize("user", ["admin:pw-a", "nonames:pw-n"])
def test_a_stream_to_come_that_the_followed_one_sources_is_a_loop(
    server: str, stream: MakeStream, tmp_path: Path, user: str
) -> None:
    from nats.js.api import StreamSource

    coming = f"NEW{user[:3].upper()}"
    followed = stream(subjects=["{name}.>"], sources=[StreamSource(name=coming)])
    url = f"nats://{user}@{server}"
    r = follow_copy(f"{url}/{followed}", f"{url}/{coming}/{coming}.in", tmp_path)
    assert refused_as_loop(r), r.stderr
