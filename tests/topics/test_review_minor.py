"""Minor defects a user-level review found, each through the real CLI against the real servers:
a follower whose pipe reader left, bad NATS subjects, JSON header values, connect errors' reasons."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from rqtest import js_call, popen_rq, read_lines, rq_command, run_rq, silent_server

pytestmark = pytest.mark.integration


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"RQ_TOPICS_DIR": str(tmp_path / "topics")}


def stream_exists(url: str, name: str) -> bool:
    from nats.js.errors import NotFoundError

    try:
        js_call(url, lambda js: js.stream_info(name))
    except NotFoundError:
        return False
    return True


# -- 1. `rq tail -f … | head -n 3` exits when head does, not at the next record ------------------


def reader_leaves(proc: subprocess.Popen[bytes], lines: list[bytes]) -> None:
    """Reads `lines` as `head` would, closes the pipe, and expects rq to exit 0 at once, silently,
    with no further record arriving (before the fix it waited for one)."""
    read_lines(proc, lines)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    try:
        assert proc.wait(60) == 0  # (the bug: it waited for ever)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.stderr.read() == b""


@pytest.mark.parametrize("command", ["tail", "replay"])
def test_a_follower_exits_when_its_pipe_reader_leaves(command: str, env: dict[str, str]) -> None:
    assert run_rq("produce", "ev", input=b"1\n2\n3\n", env=env).returncode == 0
    where = ["-n", "3"] if command == "tail" else ["--from", "start"]
    proc = popen_rq(command, "ev", *where, "-f", "--format", "raw", "-q", env=env)
    reader_leaves(proc, [b"1", b"2", b"3"])


def test_a_jetstream_follower_exits_when_its_pipe_reader_leaves(
    nats_url: str, stream_name: str, env: dict[str, str]
) -> None:
    url = f"{nats_url}/{stream_name}/{stream_name}.a"
    assert run_rq("produce", url, input=b"1\n2\n3\n", env=env).returncode == 0
    proc = popen_rq("tail", url, "-n", "3", "-f", "--format", "raw", env=env)
    reader_leaves(proc, [b"1", b"2", b"3"])


def test_an_mqtt_tail_exits_when_its_pipe_reader_leaves(mqtt_url: str, env: dict[str, str]) -> None:
    topic = f"rqtest/{uuid.uuid4().hex[:8]}"
    proc = popen_rq("tail", f"{mqtt_url}/{topic}", "--format", "raw", env=env)
    assert proc.stderr is not None
    assert b"listening on" in proc.stderr.readline()
    assert run_rq("produce", f"{mqtt_url}/{topic}", input=b"1\n2\n3\n", env=env).returncode == 0
    reader_leaves(proc, [b"1", b"2", b"3"])


def test_a_follower_writing_to_a_file_is_not_stopped_by_the_watch(
    env: dict[str, str], tmp_path: Path
) -> None:
    assert run_rq("produce", "ev", input=b"1\n2\n", env=env).returncode == 0
    out = tmp_path / "out"
    with out.open("wb") as f:
        r = subprocess.run(
            [*rq_command(), "tail", "ev", "-f", "--timeout", "0.5", "--format", "raw"],
            stdout=f,
            stderr=subprocess.PIPE,
            env={**os.environ, **env},
            timeout=30,
            check=False,
        )
    assert r.returncode == 0 and r.stderr == b"" and out.read_bytes() == b"1\n2\n"


# -- 2. a bad NATS subject is a usage error, found before connecting ------------------------------


@pytest.mark.parametrize("subject", ["a b", "a..b", ".a", "a.", "a%09b", "a.*", "a.>", "*", ">"])
def test_produce_to_a_bad_or_wildcard_subject_is_a_usage_error(
    subject: str, nats_url: str, stream_name: str, env: dict[str, str]
) -> None:
    r = run_rq("produce", f"{nats_url}/{stream_name}/{subject}", input=b"x\n", env=env)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count(b"\n") == 1 and b"subject" in r.stderr
    assert not stream_exists(nats_url, stream_name)  # nothing created, nothing published


@pytest.mark.parametrize("subject", ["a b", "a..b", "a.>.b", "a.", "a%20b"])
def test_a_bad_subject_to_read_is_a_usage_error_before_connecting(subject: str, env: dict[str, str]) -> None:
    # port 1: nobody listens there, so exit 2 (not 6) shows it was refused before connecting
    for args in (["tail"], ["replay", "--from", "start"], ["offsets"]):
        r = run_rq(*args[:1], f"nats://127.0.0.1:1/S/{subject}", *args[1:], env=env)
        assert r.returncode == 2, (args, r.stderr)
        assert r.stderr.count(b"\n") == 1 and b"subject" in r.stderr


def test_wildcard_filters_still_read_and_a_wildcard_to_topic_is_refused(
    nats_url: str, stream_name: str, env: dict[str, str]
) -> None:
    assert run_rq("produce", f"{nats_url}/{stream_name}/{stream_name}", input=b"x\n", env=env).returncode == 0
    for subject in ("*", ">"):
        r = run_rq("tail", f"{nats_url}/{stream_name}/{subject}", "--format", "raw", env=env)
        assert r.returncode == 0 and r.stdout == b"x\n", r.stderr
    assert run_rq("produce", "src", input=b"y\n", env=env).returncode == 0
    r = run_rq("replay", "src", "--to-topic", f"{nats_url}/{stream_name}/>", env=env)
    assert r.returncode == 2 and b"wildcard" in r.stderr


# -- 3. JSON header values that are not strings ------------------------------------------------


LINE = b'{"value":1,"headers":{"n":3,"f":1.50,"e":1e2,"big":123456789012345678901234567890,"b":true,"no":false,"s":"x","l":[1,"y"]}}\n'
STORED = {
    "n": "3",
    "f": "1.50",
    "e": "1e2",
    "big": "123456789012345678901234567890",
    "b": "true",
    "no": "false",
    "s": "x",
    "l": ["1", "y"],
}


def test_number_and_boolean_header_values_are_stored_as_their_json_text(
    nats_url: str, stream_name: str, env: dict[str, str]
) -> None:
    r = run_rq("produce", "hdr", "--format", "json", input=LINE, env=env)
    assert r.returncode == 0, r.stderr
    r = run_rq("tail", "hdr", "--format", "json", env=env)
    assert json.loads(r.stdout)["headers"] == STORED
    # NATS stores the same text (one value per name: a repeated one is refused, not cut to one)
    topic = f"{nats_url}/{stream_name}/{stream_name}.h"
    r = run_rq("produce", topic, "--format", "json", input=LINE, env=env)
    assert r.returncode == 2 and b"header 'l' repeats" in r.stderr and r.stderr.count(b"\n") == 1
    single = LINE.replace(b',"l":[1,"y"]', b"")
    r = run_rq("produce", topic, "--format", "json", input=single, env=env)
    assert r.returncode == 0, r.stderr
    r = run_rq("tail", topic, "--format", "json", env=env)
    assert [json.loads(x)["headers"] for x in r.stdout.splitlines()] == [
        {k: v for k, v in STORED.items() if k != "l"}
    ]


@pytest.mark.parametrize(
    ("headers", "named"),
    [
        ('{"gone":null}', b"gone"),
        ('{"obj":{"x":1}}', b"obj"),
        ('{"deep":[[1]]}', b"deep"),
        ('{"ln":[null]}', b"ln"),
    ],
)
def test_a_header_value_with_no_one_text_is_refused_naming_it(
    headers: str, named: bytes, env: dict[str, str]
) -> None:
    line = b'{"value":"ok"}\n{"value":1,"headers":' + headers.encode() + b"}\n"
    r = run_rq("produce", "hdr", "--format", "json", input=line, env=env)
    assert r.returncode == 2 and r.stderr.count(b"\n") == 1
    assert b"input line 2" in r.stderr and b"header " + named in r.stderr.replace(b"'", b"").replace(
        b'"', b""
    )
    # the bad line's batch is not stored (it is one read: neither of its records)
    r = run_rq("tail", "hdr", "--format", "raw", env=env)
    assert r.stdout == b""


# -- 4. every NATS connect error says why ----------------------------------------------------------


@pytest.fixture(name="silent_server")
def silent_server_port() -> Iterator[int]:
    with silent_server() as port:
        yield port


def test_a_server_that_sends_no_info_is_named_as_such(silent_server: int, env: dict[str, str]) -> None:
    # (produce and the other commands connect through the same code)
    r = run_rq("tail", f"nats://127.0.0.1:{silent_server}/S", env=env, timeout=30)
    assert r.returncode == 6, r.stderr
    line = r.stderr.decode().strip()
    assert line.count("\n") == 0
    reason = line.split(f"127.0.0.1:{silent_server}", 1)[1].split("—")[0]
    assert "no INFO" in reason, line  # it said ": " and nothing else


def test_offsets_shows_a_dash_not_python_none(env: dict[str, str]) -> None:
    """A group with nothing committed and an empty topic printed `None` (a Python repr)."""
    assert run_rq("produce", "ev", "--format", "json", input=b'{"value": "a"}\n', env=env).returncode == 0
    assert run_rq("produce", "empty", input=b"", env=env).returncode == 0
    r = run_rq("offsets", "empty", env=env)
    assert r.returncode == 0 and b"None" not in r.stdout and b"-" in r.stdout, r
    # a group named and never committed is exit 3, one line (it was a row with a dash)
    r = run_rq("offsets", "ev", "--group", "nosuch", env=env)
    assert r.returncode == 3 and b"None" not in r.stderr and b"does not exist" in r.stderr, r


def test_key_and_header_bytes_that_are_not_utf8(tmp_path: Path) -> None:
    """They were 'unexpected UnicodeEncodeError' (exit 1), after the topic was created."""
    env = {"RQ_TOPICS_DIR": str(tmp_path / "t")}
    key, value = os.fsdecode(b"\xff"), os.fsdecode(b"h=\xfe")
    r = run_rq("produce", "b", "-k", key, "-H", value, input=b"a\n", env=env)
    assert r.returncode == 0, r.stderr
    out = json.loads(run_rq("replay", "b", "--format", "json", env=env).stdout)
    assert out["key"] == "/w==" and out["headers"] == {"h": {"base64": "/g=="}}  # the bytes given
    r = run_rq("produce", "c", "-H", os.fsdecode(b"\xfe=v"), input=b"a\n", env=env)
    assert r.returncode == 2 and b"--header name '\\xfe' is not UTF-8" in r.stderr, r.stderr
    assert not (tmp_path / "t" / "c").exists()
