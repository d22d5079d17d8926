"""Edge cases a review found in `rq produce/tail/replay`, each through the real CLI against real
files and the real test servers (NATS, Mosquitto)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from mqttkit import mqtt_publish
from rqtest import popen_rq, read_lines, rq_command, run_rq

pytestmark = pytest.mark.integration


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"RQ_TOPICS_DIR": str(tmp_path / "topics")}


def respelled(url: str, host: str) -> str:
    """The same server's URL with its host written another way."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{host}:{parts.port}"


def one_refusal(r: object, flag: str) -> None:
    err = r.stderr.decode()  # type: ignore[attr-defined]
    assert r.returncode == 2, err  # type: ignore[attr-defined]
    assert f"{flag} " in err and "feeds what is being followed" in err and err.count("\n") == 1, err


# -- 1. the self-feed guard compares servers by address, not by spelling ------------------------


def test_replay_follow_into_the_same_stream_spelled_another_way_is_refused(
    nats_url: str, stream_name: str, env: dict[str, str]
) -> None:
    """localhost and 127.0.0.1 are one NATS server: following a stream while republishing into it
    was a loop that only a full disk ended (the old guard compared the host strings)."""
    subject = f"{stream_name.lower()}.a"
    by_ip = f"{respelled(nats_url, '127.0.0.1')}/{stream_name}/{subject}"
    by_name = f"{respelled(nats_url, 'localhost')}/{stream_name}/{subject}"
    assert run_rq("produce", by_ip, input=b"x\n", env=env).returncode == 0
    r = run_rq("replay", by_name, "-f", "--to-topic", by_ip, "--timeout", "2", env=env, timeout=20)
    one_refusal(r, "--to-topic")
    r = run_rq("replay", by_ip, "--from", "start", "--format", "raw", env=env, timeout=20)
    assert r.stdout == b"x\n"  # nothing was fed back


def test_an_omitted_default_port_is_the_default_port(env: dict[str, str]) -> None:
    """nats://localhost/S and nats://127.0.0.1:4222/S are one stream: refused before connecting."""
    r = run_rq(
        "replay",
        "nats://localhost/SELF",
        "-f",
        "--to-topic",
        "nats://127.0.0.1:4222/SELF",
        env=env,
        timeout=20,
    )
    one_refusal(r, "--to-topic")


def test_tail_mqtt_record_into_the_same_broker_spelled_another_way_is_refused(
    mqtt_url: str, env: dict[str, str]
) -> None:
    r = run_rq(
        "tail",
        f"{respelled(mqtt_url, 'localhost')}/rqedge/#",
        "--record",
        f"{respelled(mqtt_url, '127.0.0.1')}/rqedge/copy",
        "--timeout",
        "1",
        env=env,
        timeout=20,
    )
    one_refusal(r, "--record")


def test_replay_follow_into_the_same_embedded_topic_through_a_symlink_is_refused(
    tmp_path: Path, env: dict[str, str]
) -> None:
    topic = tmp_path / "topics" / "ev"
    assert run_rq("produce", str(topic), input=b"x\n", env=env).returncode == 0
    link = tmp_path / "link"
    os.symlink(topic, link)
    r = run_rq("replay", str(topic), "-f", "--to-topic", str(link), "--timeout", "1", env=env, timeout=20)
    one_refusal(r, "--to-topic")
    r = run_rq("replay", str(topic), "--from", "start", "--json", "--format", "raw", env=env)
    assert json.loads(r.stdout.splitlines()[-1])["records"] == 1


# -- 2. produce --format json: a key that is not a string ----------------------------------------


def test_produce_json_a_number_key_is_stored_as_its_json_text(env: dict[str, str]) -> None:
    """{"key": 5} failed with "'int' object has no attribute 'encode'"; a key is bytes, as in kcat,
    so a number is kept as written (1.50 stays 1.50), like a header value."""
    lines = b'{"key": 5, "value": "x"}\n{"key": 1.50, "value": 1}\n{"key": false, "value": 2}\n{"key": null, "value": 3}\n'
    r = run_rq("produce", "keys", "--format", "json", input=lines, env=env)
    assert r.returncode == 0, r.stderr
    r = run_rq("tail", "keys", "--format", "{key}|{value}", env=env)
    assert r.stdout == b"5|x\n1.50|1\nfalse|2\n|3\n"
    r = run_rq("tail", "keys", "--where", '$key == "5"', "--format", "raw", env=env)
    assert r.stdout == b'"x"\n'  # the JSON value as written


@pytest.mark.parametrize(
    ("line", "text"),
    [
        (b'{"key": [5], "value": "x"}', '"key" is a list: a key is a string, a number or true/false'),
        (b'{"key": {"a": 1}, "value": "x"}', '"key" is an object'),
        (b'{"key": 5, "key_encoding": "base64", "value": "x"}', '"key_encoding": "base64" must be a string'),
    ],
)
def test_produce_json_a_key_with_no_one_text_is_refused_naming_the_line(
    env: dict[str, str], line: bytes, text: str
) -> None:
    r = run_rq("produce", "keys", "--format", "json", input=b'{"value": "ok"}\n' + line + b"\n", env=env)
    err = r.stderr.decode()
    assert r.returncode == 2, err
    assert err.startswith("rq: error: input line 2 is not a record: ") and text in err, err
    assert err.count("\n") == 1 and "attribute" not in err
    # nothing of that batch was stored: the topic it would have made is not there at all
    assert not (Path(env["RQ_TOPICS_DIR"]) / "keys").exists()


# -- 3. a middle segment cut short is damage (named, exit 5), not records gone to retention ------


def segmented_topic(env: dict[str, str]) -> Path:
    """Segments of 20 records (two batches of 10, 424 bytes each): 000…0.log holds 0..19, …40.log 40..59."""
    topic = Path(env["RQ_TOPICS_DIR"]) / "cut"
    for i in range(10):
        lines = b"".join(b"%d\n" % n for n in range(i * 10, i * 10 + 10))
        assert run_rq("produce", "cut", "--segment-bytes", "1K", "-q", input=lines, env=env).returncode == 0
    return topic


SEG = "00000000000000000040.log"


@pytest.mark.parametrize(
    ("size", "lost", "text"),
    [
        (600, "50..59", f"segment {SEG} is cut short (truncated at byte 600): offsets 50..59 are lost"),
        (300, "40..59", f"segment {SEG} is cut short (truncated at byte 300): offsets 40..59 are lost"),
        (10, "40..59", f"segment {SEG} is cut short (truncated at byte 10): offsets 40..59 are lost"),
        (424, "50..59", f"segment {SEG} ends (byte 424) before them and the next one"),
        (0, "40..59", f"segment {SEG} ends (byte 0) before them"),
    ],
)
def test_a_middle_segment_cut_short_is_reported_as_damage_naming_the_file(
    env: dict[str, str], size: int, lost: str, text: str
) -> None:
    topic = segmented_topic(env)
    os.truncate(topic / SEG, size)
    r = run_rq("replay", "cut", "--from", "start", "--format", "raw", "--json", env=env)
    err = r.stderr.decode()
    assert r.returncode == 5, err  # corruption, as docs/topics.md's table says
    assert text in err and f"offsets {lost}" in err and "cut short" in err, err
    assert "gone" not in err and "aged out" not in err and err.count("\n") == 1, err
    assert b'"event":"gap"' not in r.stdout  # not retention's gap
    r = run_rq("replay", "cut", "--from", "start", "--format", "raw", "--json", "--skip-corrupt", env=env)
    err = r.stderr.decode()
    assert r.returncode == 0, err
    assert f"skipped corrupt record(s) at offsets {lost} (segment {SEG}, byte {size})" in err, err
    first, last = (int(n) for n in lost.split(".."))
    *lines, done = r.stdout.splitlines()
    # --json: the skip's own line as soon as the records read before it are out, not at the end
    at = next(i for i, line in enumerate(lines) if line.startswith(b"{"))
    skipped, records = lines[at], lines[:at] + lines[at + 1 :]
    assert [int(v) for v in records] == [n for n in range(100) if not first <= n <= last]
    assert [int(v) for v in lines[:at]] == list(range(first)), lines[at - 2 : at + 2]
    assert (json.loads(skipped)["first"], json.loads(skipped)["last"]) == (first, last), skipped
    assert json.loads(done)["event"] == "done", done


def test_records_retention_deleted_still_age_out(env: dict[str, str]) -> None:
    """The front of the log deleted (what retention does) stays `aged out`, exit 0."""
    topic = segmented_topic(env)
    assert run_rq("offsets", "reset", "cut", "--group", "g", "--to", "0", env=env).returncode == 0
    for base in (0, 20):
        (topic / f"{base:020d}.log").unlink()
    r = run_rq("replay", "cut", "--group", "g", "--format", "raw", "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert b"offsets 0..39 aged out (retention)" in r.stderr
    assert b'"event":"gap"' in r.stdout and b"cut short" not in r.stderr


# -- 4. MQTT retained messages are marked (or skipped with --no-retained) -------------------------


@pytest.fixture
def retained_topic(mqtt_url: str) -> Iterator[str]:
    """A topic on the real broker holding a retained message (cleared afterwards)."""
    topic = f"rqedge/{uuid.uuid4().hex[:8]}/temp"
    mqtt_publish(mqtt_url, topic, b"stale", retain=True)
    yield topic
    mqtt_publish(mqtt_url, topic, b"", retain=True)  # an empty retained message removes it


def tail_then_publish(mqtt_url: str, topic: str, *args: str) -> tuple[int, bytes]:
    proc = popen_rq("tail", f"{mqtt_url}/{topic}", "--timeout", "20", *args, env={"CI": "1"})
    try:
        assert proc.stderr is not None and b"listening on" in proc.stderr.readline()
        mqtt_publish(mqtt_url, topic, b"live", retain=False)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out


def test_mqtt_tail_marks_a_retained_message(mqtt_url: str, retained_topic: str) -> None:
    """The broker's retained value came out as if it had just been published."""
    code, out = tail_then_publish(mqtt_url, retained_topic, "-n", "2", "--format", "json")
    assert code == 0
    got = [json.loads(line) for line in out.splitlines()]
    assert [(g["value"], g["headers"]) for g in got] == [("stale", {"retained": "true"}), ("live", {})]
    code, out = tail_then_publish(mqtt_url, retained_topic, "-n", "2", "--format", "table")
    assert code == 0
    rows = [line for line in out.decode().splitlines() if "stale" in line or "live" in line]
    assert "(retained)" in rows[0] and "(retained)" not in rows[1], out


def test_mqtt_tail_no_retained_skips_them(mqtt_url: str, retained_topic: str) -> None:
    code, out = tail_then_publish(mqtt_url, retained_topic, "-n", "1", "--format", "raw", "--no-retained")
    assert (code, out) == (0, b"live\n")


def test_no_retained_is_for_mqtt_only(env: dict[str, str]) -> None:
    assert run_rq("produce", "ev", input=b"x\n", env=env).returncode == 0
    r = run_rq("tail", "ev", "--no-retained", env=env)
    assert r.returncode == 2 and r.stderr == b"rq: error: --no-retained is for MQTT topics\n"


# -- 5. a follow stopped by Ctrl-C (or SIGTERM) still ends --json with its done line --------------


@pytest.mark.parametrize(
    ("args", "sig", "error"),
    [
        (["tail", "ev", "-n", "2", "-f"], signal.SIGINT, "interrupted"),
        (["tail", "ev", "-n", "2", "-f"], signal.SIGTERM, "stopped by SIGTERM"),
        (["replay", "ev", "--from", "1", "-f"], signal.SIGINT, "interrupted"),
        (["replay", "ev", "--from", "1", "-f", "--group", "g", "--commit"], signal.SIGINT, "interrupted"),
        # --commit handles the signals itself: SIGTERM said "rq: interrupted" there (review)
        (
            ["replay", "ev", "--from", "1", "-f", "--group", "g", "--commit"],
            signal.SIGTERM,
            "stopped by SIGTERM",
        ),
    ],
)
def test_an_interrupted_follow_prints_its_done_line(
    env: dict[str, str], args: list[str], sig: signal.Signals, error: str
) -> None:
    assert run_rq("produce", "ev", input=b"1\n2\n3\n", env=env).returncode == 0
    proc = popen_rq(*args, "--json", "--format", "raw", env=env)
    try:
        read_lines(proc, [b"2", b"3"])  # caught up: now waiting for more
        time.sleep(0.3)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    done = json.loads(out.splitlines()[-1])
    assert done["event"] == "done" and done["records"] == 2 and done["next_offset"] == 3, out
    assert done["error"] == error
    if "--commit" in args:
        assert done["committed"] == {"group": "g", "offset": 3}
    assert err.decode().splitlines()[-1] == f"rq: {error}"


def test_produce_stopped_by_sigterm_says_so_in_its_done_line(env: dict[str, str]) -> None:
    # the done line said "error": "interrupted" while stderr said "rq: stopped by SIGTERM"
    proc = subprocess.Popen(
        [*rq_command(), "produce", "ev-term", "--json"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **env},
    )
    try:
        assert proc.stdin is not None
        proc.stdin.write(b"1\n")
        proc.stdin.flush()
        # its ack line says the record is written: rq is running its command (a fixed 1 s pause
        # could end before a slow runner had even started the interpreter: killed, exit -15)
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline())["event"] == "ack"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert json.loads(out.splitlines()[-1])["error"] == "stopped by SIGTERM", out
    assert err.decode().splitlines()[-1] == "rq: stopped by SIGTERM"
