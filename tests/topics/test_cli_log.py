"""`rq produce/tail/replay/offsets` on the embedded log, through the real CLI (subprocesses)."""

from __future__ import annotations

import base64
import contextlib
import fcntl
import itertools
import json
import os
import signal
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from rqtest import popen_rq, read_lines, rq_command, run_rq, wait_or_fail

from topics.embedded.log import LogWriter


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"RQ_TOPICS_DIR": str(tmp_path / "topics")}


def jlines(out: bytes) -> list[dict]:
    return [json.loads(line) for line in out.decode().splitlines() if line.strip()]


def rq_piped(pipeline: str, env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    """`rq PIPELINE` through bash with pipefail: rq's own exit status, whatever reads its output."""
    rq = " ".join(rq_command())
    return subprocess.run(
        ["bash", "-c", f"set -o pipefail; {rq} {pipeline}"],
        capture_output=True,
        env={**os.environ, **env},
        timeout=120,
        check=False,
    )


def produce(env: dict[str, str], topic: str, data: bytes, *args: str) -> list[dict]:
    r = run_rq("produce", topic, "--json", *args, input=data, env=env)
    assert r.returncode == 0, r.stderr
    return jlines(r.stdout)


SAMPLES = [
    {
        "id": f"s{i}",
        "image": {"uri": f"s3://ds/{i}.png"},
        "audio": {"uri": f"s3://ds/{i}.wav"},
        "metadata": {"quality_score": q, "source": "crawl"},
        "tags": t,
    }
    for i, (q, t) in enumerate(
        [(0.95, ["edge-case"]), (0.5, ["edge-case"]), (0.99, ["night"]), (0.91, ["edge-case", "x"])]
    )
]


def test_produce_tail_replay_fields_where(env: dict[str, str]) -> None:
    data = b"".join(json.dumps(s).encode() + b"\n" for s in SAMPLES)
    acks = produce(env, "samples", data, "--key", "cam-1", "--header", "run=7")
    assert acks[-1]["event"] == "done" and acks[-1]["records"] == 4
    r = run_rq("tail", "samples", "-n", "2", "--format", "json", env=env)
    assert r.returncode == 0, r.stderr
    lines = jlines(r.stdout)
    assert [x["offset"] for x in lines] == [2, 3]
    assert (
        lines[0]["key"] == "cam-1"
        and lines[0]["headers"] == {"run": "7"}
        and lines[0]["value_encoding"] == "json"
    )
    r = run_rq(
        "replay",
        "samples",
        "--from",
        "start",
        "--format",
        "json",
        "--where",
        'metadata.quality_score > 0.9 and "edge-case" in tags',
        "--fields",
        "image,metadata.quality_score",
        env=env,
    )
    assert r.returncode == 0, r.stderr
    got = jlines(r.stdout)
    assert [x["offset"] for x in got] == [0, 3]
    assert got[0]["value"] == {"image": {"uri": "s3://ds/0.png"}, "metadata": {"quality_score": 0.95}}
    r = run_rq("replay", "samples", "--from", "1:3", "--format", "{offset} {value.id} {headers.run}", env=env)
    assert r.stdout == b"1 s1 7\n2 s2 7\n"


def test_binary_and_non_utf8_roundtrip_json_and_raw(env: dict[str, str]) -> None:
    payloads = [
        bytes(range(256)),
        b"\xff\xfe caf\xe9",
        "naïve ünïcode".encode(),
        b"",
        b'{"a": [1, 2]}',
        b"\n\x00\n",
    ]
    # raw: one record per produce (binary may contain newlines)
    for p in payloads:
        produce(env, "bin", p, "--format", "raw")
    r = run_rq("replay", "bin", "--from", "start", "--format", "json", env=env)
    lines = jlines(r.stdout)
    assert [x["value_encoding"] for x in lines] == ["base64", "base64", "text", "text", "json", "text"]
    assert base64.b64decode(lines[0]["value"]) == payloads[0]
    # json back in: an exact copy of every byte
    r2 = run_rq("produce", "bin-copy", "--format", "json", input=r.stdout, env=env)
    assert r2.returncode == 0, r2.stderr
    copy = jlines(run_rq("replay", "bin-copy", "--from", "start", "--format", "json", env=env).stdout)
    strip = [{k: v for k, v in x.items() if k != "timestamp"} for x in lines]
    assert [{k: v for k, v in x.items() if k != "timestamp"} for x in copy] == strip
    # raw: the exact bytes, each followed by the separator
    r3 = run_rq("replay", "bin-copy", "--from", "start", "--format", "raw", "-0", env=env)
    assert r3.stdout == b"".join(p + b"\0" for p in payloads)  # JSON values too, spaces and all
    r3 = run_rq("replay", "bin", "--from", "start", "--format", "raw", env=env)
    assert r3.stdout == b"".join(p + b"\n" for p in payloads)
    # NUL-separated raw values survive a round trip through produce -0
    nul_free = [bytes(range(1, 256)), payloads[1], b"line\nbreaks\n"]
    r4 = run_rq("produce", "bin-nul", "-0", input=b"\0".join(nul_free) + b"\0", env=env)
    assert r4.returncode == 0
    r5 = run_rq("replay", "bin-nul", "--from", "start", "--format", "raw", "--null", env=env)
    assert r5.stdout.split(b"\0")[:-1] == nul_free


def test_exact_time_bounds_and_exit_at_end(env: dict[str, str]) -> None:
    for batch in (b"a1\na2\n", b"b1\nb2\nb3\n", b"c1\n"):
        produce(env, "timed", batch)
        time.sleep(0.03)
    lines = jlines(run_rq("replay", "timed", "--from", "start", "--format", "json", env=env).stdout)
    ts = {x["value"]: x["timestamp"] for x in lines}
    t_b, t_c = ts["b1"], ts["c1"]
    assert ts["a2"] < t_b < t_c
    r = run_rq("replay", "timed", "--from", f"@{t_b}", "--to", f"@{t_c}", "--format", "raw", env=env)
    assert r.stdout == b"b1\nb2\nb3\n"
    iso = datetime.fromtimestamp(t_b / 1000, UTC).isoformat(timespec="milliseconds")
    r = run_rq("replay", "timed", "--from", f"@{iso}:@{t_c}", "--format", "raw", env=env)
    assert r.stdout == b"b1\nb2\nb3\n"
    r = run_rq("replay", "timed", "--from", f"@{t_b + 1}", "--format", "raw", env=env)
    assert r.stdout == b"c1\n"  # nothing before the --from time
    r = run_rq("replay", "timed", "--from", "4", "--to", "1000000", "--format", "raw", env=env, timeout=20)
    assert r.returncode == 0 and r.stdout == b"b3\nc1\n"  # --to past the end: exits at the end
    r = run_rq("tail", "timed", "-n", "2", "--format", "raw", env=env, timeout=20)
    assert r.stdout == b"b3\nc1\n"
    r = run_rq("replay", "timed", "--from", "-2", "--count", "1", "--format", "raw", env=env)
    assert r.stdout == b"b3\n"


@pytest.mark.parametrize(
    ("args", "code", "text"),
    [
        (["replay", "timed", "--from", "@yesterday"], 2, "bad time"),
        (["replay", "timed", "--from", "5:3"], 2, "end comes before the start"),
        (["replay", "nope", "--from", "start"], 3, "does not exist"),
        (["tail", "nope"], 3, "does not exist"),
        (["offsets", "nope"], 3, "does not exist"),
        (["replay", "timed", "--where", "a ==", "--from", "start"], 2, "--where"),
        (["replay", "timed", "--rate", "fast"], 2, "--rate"),
        (["replay", "nats://127.0.0.1:1/S", "--from", "start"], 6, "cannot reach NATS"),
        (["tail", "mqtt://127.0.0.1:1/x"], 6, "cannot reach MQTT"),
        (["replay", "mqtt://127.0.0.1:1/x"], 10, "MQTT has none"),
        (["replay", "timed", "--commit"], 2, "--group"),
        (["produce", "sized", "--segment-bytes", "-5"], 2, "not a size"),
        (["produce", "sized", "--retention-bytes", "inf"], 2, "not a size"),
        (["produce", "sized", "--retention-bytes", "0"], 2, "bad size"),
        (["produce", "sized", "--segment-bytes", "0.1"], 2, "not a whole number of bytes"),
        (["produce", "sized", "--retention-age", "0s"], 2, "bad duration"),
        (["produce", "sized", "--retention-age", "0ms"], 2, "bad duration"),
        (["produce", "sized", "--retention-age", "-1d"], 2, "bad duration"),
        (["produce", "sized", "--retention-age", ""], 2, "bad duration"),
        (["replay", "timed", "--from", "start", "--save-spec", "/nonexistent-rq/s.json"], 3, "--save-spec"),
        (
            ["replay", "timed", "--from", "start", "-f", "--to-topic", "timed"],
            2,
            "feeds what is being followed",
        ),
        (["tail", "timed", "-f", "--record", "timed"], 2, "feeds what is being followed"),
        (["tail", "timed", "-f", "--timeout", "nan"], 2, "positive number of seconds"),
        (["tail"], 2, "Missing argument 'TOPIC'"),
        (["tail", "./\x1b]0;owned\x07"], 3, "\\x1b]0;owned\\x07"),  # a name's escapes stay inert
    ],
)
def test_bad_input_one_line_and_exit_code(env: dict[str, str], args: list[str], code: int, text: str) -> None:
    produce(env, "timed", b"x\n")
    r = run_rq(*args, env=env, timeout=30)
    err = r.stderr.decode()
    assert r.returncode == code, err
    assert text in err and err.count("\n") == 1 and "Traceback" not in err


def test_produce_never_claims_a_directory_that_holds_other_files(tmp_path: Path, env: dict[str, str]) -> None:
    """`rq produce .` must not scatter segments, a lock and retention among someone's files."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_bytes(b"mine")
    for topic in (str(home), f"{home}/."):
        r = run_rq("produce", topic, input=b"x\n", env=env)
        err = r.stderr.decode()
        assert r.returncode == 1 and "not a topic" in err and err.count("\n") == 1, err
    assert sorted(p.name for p in home.iterdir()) == ["notes.txt"]
    r = run_rq("produce", str(home / "notes.txt"), input=b"x\n", env=env)
    assert r.returncode == 1 and b"is a file" in r.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    produce(env, str(empty), b"a\n")
    produce(env, str(empty), b"b\n")  # a topic now: appending is fine
    assert run_rq("tail", str(empty), "--format", "raw", env=env).stdout == b"a\nb\n"


def test_damaged_group_and_config_files_are_one_line_errors(env: dict[str, str]) -> None:
    produce(env, "dmg", b"a\nb\nc\n")
    topic = Path(env["RQ_TOPICS_DIR"]) / "dmg"
    (topic / "groups").mkdir()
    for body in (b"garbage", b"[1]", b'{"committed": "3"}'):
        (topic / "groups" / "g.json").write_bytes(body)
        for args in (["offsets", "dmg"], ["replay", "dmg", "--group", "g"]):
            r = run_rq(*args, env=env)
            err = r.stderr.decode()
            assert r.returncode == 5 and "group g" in err and err.count("\n") == 1, (body, args, err)
    # What the message says to do works, and mends it.
    r = run_rq("offsets", "reset", "dmg", "--group", "g", "--to", "1", env=env)
    assert r.returncode == 0 and b"damaged" in r.stderr, r.stderr
    assert jlines(run_rq("offsets", "dmg", "--json", env=env).stdout)[0]["groups"][0]["committed"] == 1
    for body in (b'{"segment_bytes": "x"}', b"[]", b'{"retention_bytes": -1}'):
        (topic / "topic.json").write_bytes(body)
        r = run_rq("produce", "dmg", "--segment-bytes", "1M", input=b"d\n", env=env)
        err = r.stderr.decode()
        assert r.returncode == 1 and "topic.json" in err and err.count("\n") == 1, (body, err)


def test_groups_offsets_commit_and_reset(env: dict[str, str]) -> None:
    produce(env, "g", b"".join(b"%d\n" % i for i in range(10)))
    # inspection has no side effects
    run_rq("replay", "g", "--group", "trainer", "--from", "start", env=env)
    off = jlines(run_rq("offsets", "g", "--json", env=env).stdout)[0]
    assert off["groups"] == [] and (off["first"], off["last"], off["end"]) == (0, 9, 10)
    r = run_rq("replay", "g", "--group", "trainer", "--count", "4", "--commit", "--format", "raw", env=env)
    assert r.stdout == b"0\n1\n2\n3\n"
    off = jlines(run_rq("offsets", "g", "--group", "trainer", "--json", env=env).stdout)[0]
    assert off["groups"] == [{"group": "trainer", "committed": 4, "lag": 6}]
    r = run_rq("replay", "g", "--group", "trainer", "--format", "raw", "--commit", env=env)
    assert r.stdout == b"4\n5\n6\n7\n8\n9\n"
    r = run_rq("offsets", "reset", "g", "--group", "trainer", "--to", "-3", "--dry-run", "--json", env=env)
    assert jlines(r.stdout)[0]["after"] == 7
    assert jlines(run_rq("offsets", "g", "--json", env=env).stdout)[0]["groups"][0]["committed"] == 10
    run_rq("offsets", "reset", "g", "--group", "trainer", "--to", "-3", env=env)
    r = run_rq("replay", "g", "--group", "trainer", "--format", "raw", env=env)
    assert r.stdout == b"7\n8\n9\n"
    assert run_rq("offsets", "g", "--group", "../evil", env=env).returncode == 2


def test_commit_reports_only_what_it_stored_and_huge_offsets_are_usage_errors(env: dict[str, str]) -> None:
    produce(env, "gc", b"a\nb\n")
    r = run_rq("replay", "gc", "--from", "999", "--group", "g2", "--commit", "--json", env=env)
    assert r.returncode == 0 and jlines(r.stdout)[-1]["committed"] is None
    assert jlines(run_rq("offsets", "gc", "--json", env=env).stdout)[0]["groups"] == []
    r = run_rq("replay", "gc", "--group", "g2", "--commit", "--json", env=env)
    assert jlines(r.stdout)[-1]["committed"] == {"group": "g2", "offset": 2}
    for spec in ("99999999999999999999999", "-99999999999999999999", "1:+99999999999999999999"):
        r = run_rq("replay", "gc", "--from", spec, "--json", env=env)
        assert r.returncode == 2 and r.stderr.count(b"\n") == 1, r.stderr


def test_save_spec_and_replay_by_spec_detects_changed_data(env: dict[str, str], tmp_path: Path) -> None:
    data = b"".join(json.dumps(s).encode() + b"\n" for s in SAMPLES * 5)
    produce(env, "rep", data)
    spec = tmp_path / "run.json"
    first = run_rq(
        "replay",
        "rep",
        "--from",
        "2",
        "--to",
        "15",
        "--where",
        "metadata.quality_score > 0.9",
        "--format",
        "raw",
        "--save-spec",
        str(spec),
        env=env,
    )
    assert first.returncode == 0, first.stderr
    saved = json.loads(spec.read_text())
    assert (saved["start"], saved["stop"], saved["where"]) == (2, 15, "metadata.quality_score > 0.9")
    assert saved["records"] == len(first.stdout.splitlines()) and saved["digest"].startswith("xxh3_128:")
    produce(env, "rep", b'{"later": true}\n')  # appending does not change the pinned range
    again = run_rq("replay", "--spec", str(spec), "--format", "raw", env=env)
    assert again.returncode == 0, again.stderr
    assert again.stdout == first.stdout
    # Same offsets, different bytes (a rewritten topic): loud failure, exit 5.
    topic_dir = Path(env["RQ_TOPICS_DIR"]) / "rep"
    for p in topic_dir.iterdir():
        if p.suffix in (".log", ".idx"):
            p.unlink()
    produce(env, "rep", data.replace(b"crawl", b"CRAWL"))
    bad = run_rq("replay", "--spec", str(spec), "--format", "raw", env=env)
    assert bad.returncode == 5 and b"DOES NOT MATCH" in bad.stderr
    clash = run_rq("replay", "--spec", str(spec), "--from", "0", env=env)
    assert clash.returncode == 2


def test_rate_original_keeps_spacing_and_to_topic_republishes(env: dict[str, str]) -> None:
    produce(env, "paced", b"a\n")
    time.sleep(0.4)
    produce(env, "paced", b"b\n")
    started = time.monotonic()
    r = run_rq("replay", "paced", "--from", "start", "--rate", "original", "--to-topic", "copy", env=env)
    took = time.monotonic() - started
    assert r.returncode == 0, r.stderr
    assert took >= 0.35  # behaviour (the gap was reproduced), not a speed claim
    r = run_rq("replay", "copy", "--from", "start", "--format", "raw", env=env)
    assert r.stdout == b"a\nb\n"
    r = run_rq("replay", "paced", "--from", "start", "--rate", "4x", "--format", "raw", env=env)
    assert r.stdout == b"a\nb\n"


def test_to_topic_gives_the_copies_new_timestamps(env: dict[str, str]) -> None:
    with LogWriter(Path(env["RQ_TOPICS_DIR"]) / "old") as w:
        w.append([(1_000, b"k", (("h", b"v"),), b"from 1970")])
    before = int(time.time() * 1000)
    assert run_rq("replay", "old", "--to-topic", "new", env=env).returncode == 0
    (rec,) = jlines(run_rq("replay", "new", "--format", "json", env=env).stdout)
    assert rec["timestamp"] >= before and (rec["key"], rec["value"]) == ("k", "from 1970")


def test_flipped_byte_reported_with_offset_and_skip_corrupt(env: dict[str, str]) -> None:
    produce(env, "rot", b"".join(b"record-%05d\n" % i for i in range(3000)))
    seg = next((Path(env["RQ_TOPICS_DIR"]) / "rot").glob("*.log"))
    data = bytearray(seg.read_bytes())
    pos = data.index(b"record-01234") + 8
    data[pos] ^= 0x01
    seg.write_bytes(bytes(data))
    r = run_rq("replay", "rot", "--from", "start", "--format", "raw", env=env)
    assert r.returncode == 5
    assert b"offset 1234" in r.stderr
    assert r.stdout.splitlines()[-1] == b"record-01233"  # everything before it, nothing bad
    r = run_rq("replay", "rot", "--from", "start", "--format", "raw", "--skip-corrupt", env=env)
    assert r.returncode == 0
    lines = r.stdout.splitlines()
    assert len(lines) == 2999 and b"record-01234" not in lines
    assert b"offset 1234" in r.stderr


def test_lost_data_at_the_end_is_reported_by_every_reader(env: dict[str, str]) -> None:
    # The page holding the newest batch's header was zeroed (a power cut that kept the size):
    # produce stopped with exit 5, but replay and tail -n 3 exited 0 and offsets said last 99.
    t = Path(env["RQ_TOPICS_DIR"]) / "lost"
    produce(env, "lost", b"".join(b"%d\n" % i for i in range(100)))
    produce(env, "lost", b"y" * 20_000 + b"\n")
    seg = next(t.glob("*.log"))
    data = bytearray(seg.read_bytes())
    last = data.rindex(b"RQB1")
    page_end = (last // 4096 + 1) * 4096
    data[last:page_end] = bytes(page_end - last)
    seg.write_bytes(bytes(data))
    for args in (
        ["offsets", "lost"],
        ["replay", "lost", "--format", "raw"],
        ["tail", "lost", "-n", "3", "--format", "raw"],
        ["replay", "lost", "--from", "100", "--format", "raw"],
    ):
        r = run_rq(*args, env=env)
        assert r.returncode == 5, (args, r.stderr)
        assert b"offset 100 " in r.stderr, args
    r = run_rq("replay", "lost", "--from", "0:50", "--format", "raw", env=env)
    assert r.returncode == 0 and r.stdout.splitlines()[-1] == b"49"
    r = run_rq("produce", "lost", input=b"more\n", env=env)
    assert r.returncode == 5 and b"offset 100 " in r.stderr


def test_a_torn_tail_is_not_reported_by_readers(env: dict[str, str]) -> None:
    t = Path(env["RQ_TOPICS_DIR"]) / "torn"
    produce(env, "torn", b"".join(b"%d\n" % i for i in range(100)))
    with open(next(t.glob("*.log")), "ab") as fh:
        fh.write(bytes(8192))  # the file extended by a crash before the data reached the disk
    for args in (["offsets", "torn"], ["replay", "torn", "--format", "raw"], ["tail", "torn", "-n", "3"]):
        r = run_rq(*args, env=env)
        assert r.returncode == 0, (args, r.stderr)
    assert b"last 99, 100 records" in run_rq("offsets", "torn", env=env).stdout
    assert produce(env, "torn", b"more\n")[0]["first_offset"] == 100


def test_follow_sees_new_records_and_idle_timeout_ends_it(env: dict[str, str]) -> None:
    produce(env, "live", b"old\n")
    proc = subprocess.Popen(
        [*rq_command(), "tail", "live", "-f", "-n", "1", "--format", "raw", "--timeout", "4"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **env},
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"old\n"
    # The library's writer in this process appends at once: the follower's idle timeout cannot run
    # out first, as it could while a second `rq produce` started up on a loaded machine.
    with LogWriter(Path(env["RQ_TOPICS_DIR"]) / "live") as writer:
        writer.append([(None, None, (), b"new")])
    assert proc.stdout.readline() == b"new\n"
    assert proc.wait(30) == 0


def test_sigterm_stops_a_committing_follower_like_ctrl_c(env: dict[str, str]) -> None:
    produce(env, "svc", b"".join(b"%d\n" % i for i in range(50)))
    proc = popen_rq("replay", "svc", "-f", "--group", "svc", "--commit", "--format", "raw", env=env)
    read_lines(proc, [b"%d" % i for i in range(50)])
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 130
    off = jlines(run_rq("offsets", "svc", "--json", env=env).stdout)[0]
    assert off["groups"] == [{"group": "svc", "committed": 50, "lag": 0}]


def _replay_into_a_stalled_pipe(env: dict[str, str], group: str, fmt: str = "raw") -> subprocess.Popen[bytes]:
    """`rq replay -f --commit` whose stdout nobody reads after the first 50 records: returned once
    the pipe is full, so rq is blocked writing the second batch (2 MB)."""
    produce(env, "stall", b"".join(b"%d\n" % i for i in range(50)))
    with LogWriter(Path(env["RQ_TOPICS_DIR"]) / "stall") as writer:  # one batch
        writer.append([(None, None, (), b"%0100d" % i) for i in range(20_000)])
    proc = subprocess.Popen(
        [*rq_command(), "replay", "stall", "-f", "-g", group, "--commit", "--format", fmt],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **env},
    )
    assert proc.stdout is not None
    for i in range(50):
        line = proc.stdout.readline()
        assert (line if fmt == "raw" else json.loads(line)["value"]) in (b"%d\n" % i, i)
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + 60
    while int.from_bytes(fcntl.ioctl(fd, termios.FIONREAD, b"\0" * 4), "little") < 60_000:
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    return proc


def _committed(env: dict[str, str], topic: str) -> dict[str, int | None]:
    off = jlines(run_rq("offsets", topic, "--json", env=env).stdout)[0]
    return {g["group"]: g["committed"] for g in off["groups"]}


@pytest.mark.parametrize("fmt", ["raw", "json"])
def test_a_stop_signal_during_a_stalled_write_commits_what_was_written_and_exits_130(
    env: dict[str, str], fmt: str
) -> None:
    # The signal was held until the write finished, which on a stalled pipe (`| sleep 20`) was
    # never: rq ran on until the reader left, then exited 0 with nothing committed.
    proc = _replay_into_a_stalled_pipe(env, "st", fmt)
    proc.send_signal(signal.SIGTERM)
    rc = wait_or_fail(proc, 30, "rq replay --commit kept running after SIGTERM while its stdout was stalled")
    assert rc == 130
    assert proc.stdout is not None
    delivered = 50 + proc.stdout.read().count(b"\n")
    # The first batch was written out whole; the second was cut short, and a write interrupted by
    # the signal must not drop the rest of its bytes and count them as consumed.
    assert _committed(env, "stall") == {"st": 50} and delivered < 20_050


def test_ctrl_c_reaching_rq_and_its_reader_exits_130_and_commits(env: dict[str, str]) -> None:
    # Ctrl-C goes to the whole pipeline: the reader's exit broke the held write, and the pending
    # interrupt was dropped: exit 0, nothing committed.
    proc = _replay_into_a_stalled_pipe(env, "si")
    assert proc.stdout is not None
    proc.send_signal(signal.SIGINT)
    proc.stdout.close()
    assert proc.wait(60) == 130
    assert _committed(env, "stall") == {"si": 50}


def test_kill_9_during_produce_keeps_every_acknowledged_batch(env: dict[str, str]) -> None:
    proc = subprocess.Popen(
        [*rq_command(), "produce", "crash", "--json"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **env},
    )
    assert proc.stdin is not None and proc.stdout is not None
    stop = threading.Event()

    def feed() -> None:
        i = 0
        try:
            while not stop.is_set():
                proc.stdin.write(b"".join(b"line-%08d-%s\n" % (j, b"p" * 150) for j in range(i, i + 500)))  # type: ignore[union-attr]
                proc.stdin.flush()  # type: ignore[union-attr]
                i += 500
        except (BrokenPipeError, ValueError, OSError):
            pass

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    acked = -1
    for _ in range(30):
        ev = json.loads(proc.stdout.readline())
        acked = ev["last_offset"]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    stop.set()
    feeder.join(5)
    r = run_rq("replay", "crash", "--from", "start", "--format", "raw", env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) >= acked + 1
    for i, line in enumerate(lines):  # every record is whole and in order; none torn
        assert line == b"line-%08d-%s" % (i, b"p" * 150)
    # The next writer recovers and continues right after the last good record.
    acks = produce(env, "crash", b"after\n")
    assert acks[0]["first_offset"] == len(lines)


def test_offsets_human_output_and_help(env: dict[str, str]) -> None:
    produce(env, "h", b"1\n2\n")
    r = run_rq("offsets", "h", env=env)
    assert r.returncode == 0 and b"first 0, last 1, 2 records" in r.stdout
    for cmd in ("produce", "tail", "replay", "offsets"):
        h = run_rq(cmd, "--help")
        assert h.returncode == 0 and b"Examples" in h.stdout
    assert sys.executable


def test_reader_leaving_the_pipe_is_not_an_error_and_commits_nothing(env: dict[str, str]) -> None:
    produce(env, "piped", b"".join(b"%0100d\n" % i for i in range(20000)))  # ~2 MB, more than a pipe holds
    r = rq_piped("replay piped --group g --commit --format raw | head -1", env)
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"%0100d\n" % 0 and r.stderr == b""
    off = jlines(run_rq("offsets", "piped", "--json", env=env).stdout)[0]
    assert off["groups"] == []  # what `head` never read was not consumed


def test_ack_reader_leaving_does_not_cut_produce_short(env: dict[str, str], tmp_path: Path) -> None:
    """`rq produce --json | head -1` exits 0 only with all of stdin stored, not the first batches."""
    data = tmp_path / "in.txt"
    n = 500_000  # ~60 batches: the reader leaves long before the last ack
    data.write_bytes(b"".join(b"%d\n" % i for i in range(n)))
    r = rq_piped(f"produce acked --json < {data} | head -1", env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["event"] == "ack"
    assert jlines(run_rq("offsets", "acked", "--json", env=env).stdout)[0]["records"] == n


def test_table_into_a_closed_pipe_exits_0(env: dict[str, str]) -> None:
    """rich exits 1 on a broken pipe; rq's consoles hand it on, so `| head` is success here too."""
    produce(env, "tbl", b"".join(b"%050d\n" % i for i in range(3000)))  # a table larger than a pipe
    r = rq_piped("tail tbl -n 3000 --format table | head -c 1", env)
    assert r.returncode == 0 and r.stderr == b"", r.stderr


def test_json_lines_stay_one_line_per_record(env: dict[str, str]) -> None:
    for value in (b'{\n  "pretty": [1,\r\n 2]\n}', b" 7 ", b'"str"', b"[]", b"\xc3\x28"):
        produce(env, "shapes", value, "--format", "raw", "--key", "k\u00e9")
    r = run_rq("replay", "shapes", "--from", "start", "--format", "json", env=env)
    lines = r.stdout.splitlines()
    assert len(lines) == 5
    got = [json.loads(x) for x in lines]
    assert got[0]["value"] == {"pretty": [1, 2]} and got[1]["value"] == 7 and got[2]["value"] == "str"
    assert got[4]["value_encoding"] == "base64" and all(g["key"] == "k\u00e9" for g in got)


def test_a_record_too_large_is_a_usage_error() -> None:
    from rqcli.commands.topics import library_errors
    from rqcli.errors import CliError
    from topics.errors import RecordTooLarge

    with pytest.raises(CliError) as err, library_errors():
        raise RecordTooLarge("too big")
    assert err.value.code == 2


class _Chunks:
    """A pipe delivering these chunks, one per read (an empty one ends the input)."""

    def __init__(self, chunks: Iterable[bytes]):
        self.chunks = iter(chunks)

    def read1(self, _n: int) -> bytes:
        return next(self.chunks, b"")

    read = read1


def test_lines_spanning_many_reads_come_out_whole_and_an_overlong_one_is_refused() -> None:
    from rqcli.commands.topics import _split_lines
    from topics.errors import RecordTooLarge

    chunks = [b"a\nbb", *[b"c" * 10] * 50, b"c\nd", b"", b"e\n\nf"]
    got = [line for batch in _split_lines(_Chunks(chunks[:-2]), b"\n") for line in batch]
    assert got == [b"a", b"bb" + b"c" * 501, b"d"]
    got = [line for batch in _split_lines(_Chunks([b"x\0y", b"y\0", b"z"]), b"\0") for line in batch]
    assert got == [b"x", b"yy", b"z"]
    # An unfinished line past the limit is refused while it is read, before it is ever stored.
    seen: list[bytes] = []
    with pytest.raises(RecordTooLarge, match="input line 2 "):
        chunks = itertools.chain([b"ok\n"], itertools.repeat(b"z" * 10))  # endless
        for batch in _split_lines(_Chunks(chunks), b"\n", limit=100):
            seen.extend(batch)
    assert seen == [b"ok"]
    ok = [line for b in _split_lines(_Chunks([b"z" * 50, b"z" * 50 + b"\n"]), b"\n", limit=100) for line in b]
    assert ok == [b"z" * 100]
    with pytest.raises(RecordTooLarge):
        list(_split_lines(_Chunks([b"z" * 50, b"z" * 51 + b"\n"]), b"\n", limit=100))


def test_an_endless_line_is_refused_with_exit_2_and_nothing_of_it_stored(env: dict[str, str]) -> None:
    # It grew rq's memory without bound (and re-joined the line on every read: quadratic).
    proc = subprocess.Popen(
        [*rq_command(), "produce", "endless"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **env},
    )
    assert proc.stdin is not None
    block = b"x" * (1 << 20)
    try:
        proc.stdin.write(b"first\n")
        for _ in range(300):  # 300 MiB: past the 256 MiB a record can hold
            proc.stdin.write(block)
        proc.stdin.close()
    except BrokenPipeError:
        pass  # rq stopped reading: it refused the line
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and b"input line 2 is over" in err and err.count(b"\n") == 1, err
    r = run_rq("replay", "endless", "--format", "raw", env=env)
    assert r.returncode == 0 and r.stdout == b"first\n"


def test_table_shows_record_text_literally_never_as_markup(env: dict[str, str]) -> None:
    link = b"[link=https://evil.example]click me[/link]"
    r = run_rq("produce", "mk", "--key", "[bold]k[/bold]", env=env, input=link + b"\n[/foo] bad\n")
    assert r.returncode == 0, r.stderr
    r = run_rq("tail", "mk", "-n", "2", "--format", "table", env={**env, "COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode()
    assert link.decode() in out and "[/foo] bad" in out and "[bold]k[/bold]" in out


def test_template_output_escapes_control_characters(env: dict[str, str]) -> None:
    produce(env, "esc", b'{"x":"\\u001b[31mred"}\nbell\x07\x1b]8;;x\n')
    r = run_rq("tail", "esc", "-n", "2", "--format", "{offset} {value.x}|{value}", env=env)
    assert r.returncode == 0, r.stderr
    assert b"\x1b" not in r.stdout and b"\x07" not in r.stdout
    assert r.stdout.splitlines() == [b'0 \\x1b[31mred|{"x":"\\u001b[31mred"}', b"1 |bell\\x07\\x1b]8;;x"]


def test_a_saved_spec_keeps_a_relative_topic_path_absolute(env: dict[str, str], tmp_path: Path) -> None:
    work, other = tmp_path / "work", tmp_path / "other"
    work.mkdir()
    other.mkdir()
    r = run_rq("produce", "./events", input=b"a\nb\n", env=env, cwd=work)
    assert r.returncode == 0, r.stderr
    r = run_rq("replay", "./events", "--save-spec", "s.json", "--format", "raw", env=env, cwd=work)
    assert r.returncode == 0, r.stderr
    assert json.loads((work / "s.json").read_text())["source"] == str(work / "events")
    r = run_rq("replay", "--spec", str(work / "s.json"), "--format", "raw", env=env, cwd=other)
    assert (r.returncode, r.stdout) == (0, b"a\nb\n"), r.stderr


def test_json_copy_keeps_numbers_as_written(env: dict[str, str]) -> None:
    values = [b"-0", b"1e2", b'{"a":-0,"b":1.50}', b"123456789012345678901234567890", b'{"value":[-0.0]}']
    produce(env, "nums", b"\n".join(values) + b"\n")
    for where in ([], ["--where", "true"]):  # the second re-renders decoded values
        r = rq_piped(
            f"tail nums -n 9 --format json {' '.join(where)} | {' '.join(rq_command())} produce c{len(where)} --format json",
            env,
        )
        assert r.returncode == 0, r.stderr
        r = run_rq("tail", f"c{len(where)}", "-n", "9", "--format", "raw", env=env)
        assert r.stdout.splitlines() == values
    r = run_rq(
        "produce",
        "ws",
        "--format",
        "json",
        env=env,
        input=b'{ "headers": {"value": "h"}, "value" : { "a" : 1E5 } }\n',
    )
    assert r.returncode == 0, r.stderr
    assert run_rq("tail", "ws", "--format", "raw", env=env).stdout == b'{ "a" : 1E5 }\n'


def test_a_follower_survives_a_new_writer_cutting_a_torn_tail(env: dict[str, str]) -> None:
    """A new writer truncates a torn tail under a follower that mapped it: touching a mapped page
    past the new end of the file would kill the follower with SIGBUS (exit 135)."""
    produce(env, "bus", b"a" * 4016, "--format", "raw")  # one batch ending at byte 4096, a page end
    produce(env, "bus", b"".join(b"%d\n" % i for i in range(50)))
    seg = Path(env["RQ_TOPICS_DIR"]) / "bus" / "00000000000000000000.log"
    os.truncate(seg, 4196)  # the second batch torn, as kill -9 mid-write leaves it
    proc = subprocess.Popen(
        [*rq_command(), "tail", "bus", "-f", "--format", "{offset}", "--timeout", "30"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **env},
    )
    assert proc.stdout is not None and proc.stderr is not None
    try:
        assert proc.stdout.readline() == b"0\n"
        with LogWriter(seg.parent) as writer:  # recovery cuts the file back to 4096 bytes
            assert seg.stat().st_size == 4096
            time.sleep(1)  # the follower polls the cut file meanwhile (every 50 ms)
            writer.append([(None, None, (), b"after")])
        assert proc.stdout.readline() == b"1\n", proc.stderr.read1(4096)
    finally:
        proc.terminate()
    assert proc.wait(30) in (0, 130, -signal.SIGTERM), proc.stderr.read()


def _three_stamped_batches(env: dict[str, str], name: str) -> tuple[Path, list[int]]:
    """Offsets 0-2, 3-5, 6-8 stamped T, T+1s, T+2s (one batch each): (the segment, the stamps)."""
    stamps = [1_700_000_001_000, 1_700_000_002_000, 1_700_000_003_000]
    with LogWriter(Path(env["RQ_TOPICS_DIR"]) / name) as w:
        for b, ts in enumerate(stamps):
            w.append([(ts, None, (), b"value-%d" % (3 * b + i)) for i in range(3)])
    return Path(env["RQ_TOPICS_DIR"]) / name / "00000000000000000000.log", stamps


def _offsets_out(r: subprocess.CompletedProcess[bytes]) -> list[int]:
    return [int(x) for x in r.stdout.split()]


def test_time_bounds_never_step_silently_over_damage(env: dict[str, str]) -> None:
    seg, (_, ts2, ts3) = _three_stamped_batches(env, "flip")
    data = bytearray(seg.read_bytes())
    data[data.index(b"value-3") + 6] ^= 0x40
    seg.write_bytes(data)
    fmt_ = ("--format", "{offset}")
    r = run_rq("replay", "flip", "--from", f"@{ts2}", *fmt_, env=env)
    assert (r.returncode, r.stdout) == (5, b""), r.stderr  # as a plain replay: 3 is damaged
    assert b"offset 3" in r.stderr
    r = run_rq("replay", "flip", "--from", "0", "--to", f"@{ts2}", "--skip-corrupt", *fmt_, env=env)
    assert (r.returncode, _offsets_out(r)) == (0, [0, 1, 2]), r.stderr  # nothing stamped ts2
    # A read that starts after the damaged record of a batch is not failed by it.
    r = run_rq("replay", "flip", "--from", "4", *fmt_, env=env)
    assert (r.returncode, _offsets_out(r)) == (0, [4, 5, 6, 7, 8]), r.stderr
    r = run_rq("tail", "flip", "-n", "5", *fmt_, env=env)
    assert (r.returncode, _offsets_out(r)) == (0, [4, 5, 6, 7, 8]), r.stderr

    seg, (_, ts2, ts3) = _three_stamped_batches(env, "magic")
    data = bytearray(seg.read_bytes())
    data[data.index(b"RQB1", 1) : data.index(b"RQB1", 1) + 4] = b"XXXX"  # batch 3-5's header
    seg.write_bytes(data)
    r = run_rq("replay", "magic", "--from", f"@{ts3}", *fmt_, env=env)
    assert (r.returncode, _offsets_out(r)) == (0, [6, 7, 8]), r.stderr
    r = run_rq("offsets", "reset", "magic", "--group", "g", "--to", f"@{ts3}", "--dry-run", env=env)
    assert r.returncode == 0 and b"from - to 6" in r.stdout, (r.stdout, r.stderr)


def test_a_zero_retention_is_refused_and_the_topic_stays_writable(env: dict[str, str]) -> None:
    produce(env, "kept", b"a\n")
    for args in (["--retention-age", "0s"], ["--retention-age", "0ms"], ["--retention-bytes", "0"]):
        r = run_rq("produce", "kept", *args, input=b"b\n", env=env)
        assert r.returncode == 2 and r.stderr.count(b"\n") == 1, r.stderr
    r = run_rq("produce", "kept", env={**env, "RQ_PRODUCE_RETENTION_AGE": "0s"}, input=b"b\n")
    assert r.returncode == 2, r.stderr
    config = json.loads((Path(env["RQ_TOPICS_DIR"]) / "kept" / "topic.json").read_bytes())
    assert config["retention_ms"] is None and config["retention_bytes"] is None
    assert produce(env, "kept", b"c\n", "--retention-age", "7d")[-1]["records"] == 1
    assert produce(env, "kept", b"d\n")[-1]["records"] == 1


def test_time_bounds_below_a_millisecond_are_exact(env: dict[str, str]) -> None:
    base = 1_079_222_130_000  # 2004-03-13T23:55:30Z
    with LogWriter(Path(env["RQ_TOPICS_DIR"]) / "ms") as w:
        w.append([(base + d, None, (), b"%d" % d) for d in (0, 1, 569, 570, 571)])

    def values(*args: str) -> list[int]:
        r = run_rq("replay", "ms", "--format", "raw", *args, env=env)
        assert r.returncode == 0, r.stderr
        return [int(x) for x in r.stdout.split()]

    assert values("--from", "@2004-03-13T23:55:30.570Z") == [570, 571]
    assert values("--from", "@2004-03-13t23:55:30.570z", "--to", "@2004-03-13T23:55:30.571Z") == [570]
    assert values("--from", "@2004-03-13T23:55:30.000500Z") == [1, 569, 570, 571]
    assert values("--from", "start", "--to", "@2004-03-13T23:55:30.000500Z") == [0]


def _wait_open(proc: subprocess.Popen[bytes], path: Path) -> None:
    """Until the process holds `path` open (its reader is positioned), or it has exited."""
    for _ in range(600):
        if proc.poll() is not None:
            return
        with contextlib.suppress(OSError):
            fds = os.listdir(f"/proc/{proc.pid}/fd")
            if any(os.readlink(f"/proc/{proc.pid}/fd/{fd}") == str(path) for fd in fds):
                return
        time.sleep(0.05)


def test_a_spec_saved_from_a_timed_follow_replays_identically(env: dict[str, str], tmp_path: Path) -> None:
    t = Path(env["RQ_TOPICS_DIR"]) / "timed"
    with LogWriter(t) as w:
        w.append([(1000, None, (), b"a"), (2000, None, (), b"b")])
    spec = tmp_path / "s.json"
    proc = subprocess.Popen(
        [
            *rq_command(),
            *("replay", "timed", "--from", "@3000", "-f", "--timeout", "2"),
            *("--format", "{offset}", "--save-spec", str(spec)),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **env},
    )
    _wait_open(proc, t / "00000000000000000000.log")  # it resolved @3000 to offset 2, the end
    with LogWriter(t) as w:  # one stamped before the start time (dropped), one after
        w.append([(2500, None, (), b"early"), (3500, None, (), b"late")])
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out) == (0, b"3\n"), err
    saved = json.loads(spec.read_bytes())
    assert (saved["start"], saved["stop"], saved["records"], saved["time_from"]) == (2, 4, 1, 3000)
    r = run_rq("replay", "--spec", str(spec), "--format", "{offset}", env=env)
    assert (r.returncode, r.stdout) == (0, b"3\n"), r.stderr


def test_an_empty_spec_replays_as_empty(env: dict[str, str], tmp_path: Path) -> None:
    produce(env, "few", b"".join(b"%d\n" % i for i in range(10)))
    spec = tmp_path / "empty.json"
    r = run_rq("replay", "few", "--from", "100", "--save-spec", str(spec), env=env)
    assert (r.returncode, r.stdout) == (0, b""), r.stderr
    saved = json.loads(spec.read_bytes())
    assert (saved["start"], saved["stop"], saved["records"]) == (100, 100, 0)
    r = run_rq("replay", "--spec", str(spec), env=env)
    assert (r.returncode, r.stdout) == (0, b""), r.stderr


def test_ctrl_c_during_a_follow_saves_the_spec_where_it_stopped(env: dict[str, str], tmp_path: Path) -> None:
    produce(env, "cc", b"".join(b"%d\n" % i for i in range(5)))
    spec = tmp_path / "f.json"
    proc = popen_rq("replay", "cc", "-f", "--format", "raw", "--save-spec", str(spec), env=env)
    read_lines(proc, [b"%d" % i for i in range(5)])
    proc.send_signal(signal.SIGINT)
    assert proc.wait(30) == 130
    saved = json.loads(spec.read_bytes())
    assert (saved["start"], saved["stop"], saved["records"]) == (0, 5, 5)
    produce(env, "cc", b"later\n")  # the spec pins offsets 0..4 only
    r = run_rq("replay", "--spec", str(spec), "--format", "raw", env=env)
    assert (r.returncode, r.stdout) == (0, b"0\n1\n2\n3\n4\n"), r.stderr


def test_env_vars_follow_the_documented_option_names(env: dict[str, str], tmp_path: Path) -> None:
    """RQ_<COMMAND>_<OPTION> from the flag's name, even where the Python parameter is named otherwise."""
    produce(env, "envs", b"".join(b"%d\n" % i for i in range(20)))
    r = run_rq("tail", "envs", "--format", "raw", env={**env, "RQ_TAIL_LINES": "2"})
    assert (r.returncode, r.stdout) == (0, b"18\n19\n"), r.stderr
    r = run_rq(
        "replay", "envs", env={**env, "RQ_REPLAY_FORMAT": "raw", "RQ_REPLAY_FROM": "5", "RQ_REPLAY_TO": "7"}
    )
    assert (r.returncode, r.stdout) == (0, b"5\n6\n"), r.stderr
    r = run_rq("produce", "envs", "--json", input=b"a\0b\0", env={**env, "RQ_PRODUCE_NULL": "1"})
    assert r.returncode == 0 and jlines(r.stdout)[-1]["records"] == 2, r.stderr
    config = tmp_path / "rq.toml"
    config.write_text("[tail]\nlines = 3\n")
    r = run_rq("--config", str(config), "tail", "envs", "--format", "raw", env=env)
    assert (r.returncode, r.stdout) == (0, b"19\na\nb\n"), r.stderr


def test_template_output_escapes_bidi_overrides_as_table_does(env: dict[str, str]) -> None:
    """U+202E (right-to-left override) in a record made the rest of its line, and what the terminal
    showed after it, read backwards: table output escaped it, a template printed it raw."""
    produce(env, "bidi", "evil\u202etxt.exe\n".encode())
    for fmt in ("{value}", "table"):
        r = run_rq("tail", "bidi", "-n", "1", "--format", fmt, env=env)
        assert r.returncode == 0, r.stderr
        assert "\u202e".encode() not in r.stdout and b"evil\\u202etxt.exe" in r.stdout, fmt
