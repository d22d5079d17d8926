"""SIGINT or SIGTERM in the middle of `rq replay --group g --commit` (no --follow): the group is
committed exactly where stdout stopped, never past a record the reader did not get. A real rq
process, its stdout read in pieces by the test, the signal sent while records are flowing; the
records' values are their offsets, so what arrived is known line by line."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from jskit import MakeStream, made_streams
from rqtest import popen_rq, run_rq

_RECORDS = 200_000
_BEFORE_SIGNAL = 256 * 1024  # bytes read before the signal: well inside the replay


def _committed(topic: str, group: str, env: dict[str, str]) -> int | None:
    out = run_rq("offsets", topic, "--group", group, "--json", env=env)
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    groups = [g for r in rows for g in r.get("groups", [])]
    return next((g["committed"] for g in groups if g["group"] == group), None)


def _replay_and_signal(topic: str, group: str, sig: int, env: dict[str, str]) -> tuple[int, list[bytes]]:
    proc = popen_rq("replay", topic, "--group", group, "--commit", "--format", "raw", env=env)
    assert proc.stdout is not None and proc.stderr is not None
    fd = proc.stdout.fileno()
    got = bytearray()
    while len(got) < _BEFORE_SIGNAL:
        chunk = os.read(fd, 65536)
        assert chunk, proc.stderr.read()
        got += chunk
    proc.send_signal(sig)
    while chunk := os.read(fd, 65536):
        got += chunk
    rc = proc.wait(60)
    proc.stderr.close()
    proc.stdout.close()
    return rc, bytes(got).split(b"\n")


def _check(topic: str, group: str, sig: int, first: int, env: dict[str, str]) -> None:
    rc, lines = _replay_and_signal(topic, group, sig, env)
    assert rc == 130
    assert lines[-1] == b""  # no record cut in half
    values = [int(v) for v in lines[:-1]]
    assert values == list(range(first, first + len(values)))  # in order, none skipped
    assert len(values) < _RECORDS  # stopped in the middle
    # exactly what stdout got: nothing past it (lost), nothing before it (read twice)
    assert _committed(topic, group, env) == first + len(values)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_embedded_log(tmp_path: Path, sig: int) -> None:
    env = {"RQ_TOPICS_DIR": str(tmp_path)}
    data = b"".join(b"%d\n" % i for i in range(_RECORDS))
    assert run_rq("produce", "ev", input=data, env=env).returncode == 0
    _check("ev", "g", sig, 0, env)


@pytest.fixture
def stream(nats_url: str) -> Iterator[MakeStream]:
    with made_streams(nats_url, "sig-commit") as make:
        yield make


@pytest.mark.integration
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_jetstream(nats_url: str, stream: MakeStream, tmp_path: Path, sig: int) -> None:
    env = {"RQ_TOPICS_DIR": str(tmp_path)}
    name = stream()
    url = f"{nats_url}/{name}/{name}.x"
    data = b"".join(b"%d\n" % i for i in range(1, _RECORDS + 1))  # sequences start at 1
    assert run_rq("produce", url, input=data, env=env, timeout=120).returncode == 0
    _check(url, "g", sig, 1, env)
