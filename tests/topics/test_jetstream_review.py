"""JetStream review findings, each against a real nats-server: groups past the server's list page,
a server lost during a commit, permissions refused, credentials rq does not read, unencoded user info."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rqtest import js_call, run_rq
from test_access import _free_port, _nats_server, _wait_port
from test_jetstream import make_stream, publish

pytestmark = pytest.mark.integration


@pytest.fixture
def private_nats(tmp_path: Path) -> Iterator[Any]:
    """start(*flags) -> (port, process) of a private nats-server with JetStream, to kill or to
    configure (test_access's nats_server gives only the port)."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(*flags: str) -> tuple[int, subprocess.Popen[bytes]]:
        port = _free_port()
        where = ["-a", "127.0.0.1", "-p", str(port), "-sd", str(tmp_path / f"js{port}")]
        proc = subprocess.Popen(
            [_nats_server(), "-js", *where, *flags], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        procs.append(proc)
        _wait_port(port, proc, "nats-server")
        return port, proc

    yield start
    for p in procs:
        if p.poll() is None:
            p.terminate()
            p.wait(10)


# -- 1. every group, past the server's page of 256 consumers --------------------------------------


def _add_groups(url: str, stream: str, names: list[str], subject: str | None) -> None:
    from nats.js.api import AckPolicy, ConsumerConfig

    async def go(js: Any) -> None:
        for name in names:
            cfg = ConsumerConfig(
                durable_name=name, ack_policy=AckPolicy.EXPLICIT, filter_subject=subject, mem_storage=True
            )
            await js.add_consumer(stream, cfg)

    js_call(url, go)


def test_offsets_lists_every_group_past_the_servers_page(nats_url: str, stream_name: str) -> None:
    make_stream(nats_url, stream_name)
    publish(nats_url, f"{stream_name}.x", [b"1", b"2", b"3"])
    whole = [f"g{i:03d}" for i in range(270)]  # more than one page of the consumer list
    _add_groups(nats_url, stream_name, whole, None)
    # named to sort after the 270 others: a page read before filtering by subject loses them
    mine = ["zz-a", "zz-b"]
    _add_groups(nats_url, stream_name, mine, f"{stream_name}.x")

    r = run_rq("--json", "offsets", f"{nats_url}/{stream_name}")
    assert r.returncode == 0, r.stderr
    assert [g["group"] for g in json.loads(r.stdout)["groups"]] == whole

    r = run_rq("--json", "offsets", f"{nats_url}/{stream_name}/{stream_name}.x")
    assert r.returncode == 0, r.stderr
    assert [g["group"] for g in json.loads(r.stdout)["groups"]] == mine
