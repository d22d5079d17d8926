"""Regression tests for open topics defects: a filtered JetStream spec replay over a deleted record,
the --to-topic self-feed guard by server identity, `rq offsets` over a truncated middle segment,
--skip-corrupt events under --json, `rq produce` creating nothing when nothing was written, and an
MQTT URL whose user info holds an unencoded '/'."""

from __future__ import annotations

import contextlib
import json
import queue
import signal
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rqtest import js_call, popen_rq, run_rq
from test_access import _env, _one_line
from test_jetstream_review import _delete


@pytest.fixture
def js_stream(nats_url: str) -> Iterator[str]:
    """A unique stream name for this file's tests (names hold 'h-topics'); deleted afterwards."""
    names = [f"h-topics-{uuid.uuid4().hex[:10]}"]
    yield names[0]

    async def drop(js: Any) -> None:
        for name in (names[0], f"{names[0]}-agg"):
            try:
                await js.delete_stream(name)
            except Exception:
                pass  # never created

    js_call(nats_url, drop)


def _publish_numbers(url: str, stream: str, count: int) -> None:
    """Sequences 1..count on subject STREAM.n, values {"n": seq}."""

    async def go(js: Any) -> None:
        await js.add_stream(name=stream, subjects=[f"{stream}.>"])
        for seq in range(1, count + 1):
            await js.publish(f"{stream}.n", b'{"n": %d}' % seq)

    js_call(url, go)


# -- 1. replay --spec with --where over a deleted record the filter kept ----------------------------


@pytest.mark.integration
def test_filtered_spec_replay_over_a_deleted_kept_record_fails_before_writing(
    nats_url: str, js_stream: str, tmp_path: Path
) -> None:
    """200 messages, the spec keeps n > 100 (100 records). Deleting one the filter kept still leaves
    199 messages in the range (>= 100 pinned), so the count check passed and the replay wrote 99
    records before the digest said 'changed'. It must fail first, saying 'deleted'."""
    _publish_numbers(nats_url, js_stream, 200)
    env, spec = _env(tmp_path), tmp_path / "w.json"
    saved = ("--from", "start", "--where", "n > 100", "--save-spec", str(spec))
    r = run_rq("replay", f"{nats_url}/{js_stream}", *saved, env=env)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 100, r.stderr

    _delete(nats_url, js_stream, 20)  # one the filter dropped: the spec's records are all there
    r = run_rq("replay", "--spec", str(spec), "--format", "raw", env=env)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 100, r.stderr

    _delete(nats_url, js_stream, 150)  # one the filter kept
    for extra in ([], ["--to-topic", str(tmp_path / "copy")]):
        r = run_rq("replay", "--spec", str(spec), "--format", "raw", *extra, env=env)
        assert r.returncode == 5, r.stderr
        assert r.stdout == b"", "records written before the replay failed"
        line = _one_line(r)
        assert "deleted" in line and "hold 99 records" in line and "changed" not in line, line
    assert not (tmp_path / "copy").exists(), "the --to-topic copy was created before the check"


# -- 2. the --to-topic self-feed guard asks the server ---------------------------------------------


@pytest.mark.integration
def test_follow_into_a_stream_name_whose_publishes_land_in_the_followed_stream_is_refused(
    nats_url: str, js_stream: str, tmp_path: Path
) -> None:
    """The guard compared stream names: `--to-topic nats://…/AGG/EVT.x` (AGG takes no subjects of
    its own) passed, yet a publish to EVT.x is stored in EVT, the stream being followed; and
    following AGG, which sources EVT, while publishing into EVT was a loop as well."""
    from nats.js.api import StreamSource

    agg = f"{js_stream}-agg"
    _publish_numbers(nats_url, js_stream, 3)
    js_call(nats_url, lambda js: js.add_stream(name=agg, sources=[StreamSource(name=js_stream)]))
    env = _env(tmp_path)
    cases = [
        (f"{nats_url}/{js_stream}", f"{nats_url}/{agg}/{js_stream}.x"),
        (f"{nats_url}/{agg}", f"{nats_url}/{js_stream}/{js_stream}.x"),
        (f"{nats_url}/{js_stream}/{js_stream}.n", f"{nats_url}/{agg}/{js_stream}.n"),
    ]
    for source, target in cases:
        r = run_rq(
            "replay",
            source,
            "-f",
            "--to-topic",
            target,
            "--count",
            "20",
            "--timeout",
            "2",
            env=env,
            timeout=30,
        )
        assert r.returncode == 2, (source, target, r.stderr)
        assert "feeds what is being followed back into it" in _one_line(r), r.stderr
    # a subject the followed filter does not read is no loop (into EVT itself: AGG, without
    # subjects of its own, takes no publishes, and a copy into it is refused as such)
    r = run_rq(
        "replay", f"{nats_url}/{js_stream}/{js_stream}.n", "--from", "start", "-f", "--to-topic",
        f"{nats_url}/{js_stream}/{js_stream}.other", "--timeout", "1", env=env, timeout=30,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    r = run_rq(
        "replay", f"{nats_url}/{js_stream}/{js_stream}.n", "--from", "start", "--to-topic",
        f"{nats_url}/{agg}/{js_stream}.other", env=env, timeout=30,
    )  # fmt: skip
    assert r.returncode == 2 and f"stream {agg} takes no publishes" in _one_line(r), r.stderr


def _copy_following(env: dict[str, str], source: str, target: str) -> Any:
    """A follow copying `source` into `target`; a loop ends at --count 20, else the quiet ends it."""
    return run_rq(
        "replay", source, "--from", "start", "-f", "--to-topic", target, "--count", "20", "--timeout", "2",
        "-q", env=env, timeout=30,
    )  # fmt: skip


@pytest.mark.integration
def test_following_one_subject_into_another_of_the_same_stream_is_no_loop(
    nats_url: str, js_stream: str, tmp_path: Path
) -> None:
    """Stream S takes S.>: following S/S.n while copying into S/S.b was refused by the URL check
    (same stream name), though the follow never reads S.b. A filter that takes the target's
    subject, or the whole stream, is still a loop."""
    _publish_numbers(nats_url, js_stream, 3)
    env, url = _env(tmp_path), f"{nats_url}/{js_stream}"
    r = _copy_following(env, f"{url}/{js_stream}.n", f"{url}/{js_stream}.b")
    assert r.returncode == 0, r.stderr
    r = run_rq("replay", f"{url}/{js_stream}.b", "--from", "start", "--format", "raw", env=env)
    assert r.stdout.splitlines() == [b'{"n": 1}', b'{"n": 2}', b'{"n": 3}'], r.stderr
    for source, target in [
        (f"{url}/{js_stream}.n", f"{url}/{js_stream}.n"),
        (f"{url}/{js_stream}.*", f"{url}/{js_stream}.b"),
        (url, f"{url}/{js_stream}.b"),
    ]:
        r = _copy_following(env, source, target)
        assert r.returncode == 2 and "feeds what is being followed" in _one_line(r), (source, r.stderr)


@pytest.mark.integration
def test_following_a_mirror_of_a_mirror_into_its_origin_is_refused(
    nats_url: str, js_stream: str, tmp_path: Path
) -> None:
    """The server's check looked one level up (this stream's own mirror and sources): following
    M2, a mirror of M1, a mirror of S, while copying into S read every copy back (S grew to 21
    records at --count 20; without it, until the disk was full)."""
    from nats.js.api import StreamSource

    m1, m2 = f"{js_stream}-agg", f"{js_stream}-m2"
    _publish_numbers(nats_url, js_stream, 3)
    js_call(nats_url, lambda js: js.add_stream(name=m1, mirror=StreamSource(name=js_stream)))
    js_call(nats_url, lambda js: js.add_stream(name=m2, mirror=StreamSource(name=m1)))
    try:
        env = _env(tmp_path)
        r = _copy_following(env, f"{nats_url}/{m2}", f"{nats_url}/{js_stream}/{js_stream}.x")
        assert r.returncode == 2 and "feeds what is being followed" in _one_line(r), r.stderr
        r = run_rq("offsets", f"{nats_url}/{js_stream}", "--json", env=env)
        assert json.loads(r.stdout)["records"] == 3, r.stderr  # nothing was copied
        # a stream outside the chain is no loop
        r = _copy_following(env, f"{nats_url}/{m2}", f"{nats_url}/{m1}-other/{js_stream}-other.x")
        assert r.returncode == 0, r.stderr
    finally:

        async def drop(js: Any) -> None:
            for name in (m2, f"{m1}-other"):
                with contextlib.suppress(Exception):  # never made, if the test failed before
                    await js.delete_stream(name)

        js_call(nats_url, drop)


# -- 3. rq offsets over a middle segment cut short -------------------------------------------------


def _six_batches(tmp_path: Path) -> tuple[dict[str, str], list[Path]]:
    """Topic t: six produce runs of 10 records (one batch each), two batches to a 1 KiB segment."""
    env = {"RQ_TOPICS_DIR": str(tmp_path / "topics")}
    for run in range(6):
        lines = b"".join(b"value-%02d\n" % (run * 10 + i) for i in range(10))
        r = run_rq("produce", "t", "--segment-bytes", "1K", input=lines, env=env)
        assert r.returncode == 0, r.stderr
    return env, sorted((tmp_path / "topics" / "t").glob("*.log"))


def test_offsets_counts_only_what_a_truncated_middle_segment_still_holds(tmp_path: Path) -> None:
    """A sealed segment cut inside its last batch: `rq offsets` said 60 records, exit 0, while
    every read fails there ('offsets 10..19 are lost'). It counts the readable ones and says the
    range lost, as readers do (exit 5, the numbers first)."""
    env, segs = _six_batches(tmp_path)
    assert len(segs) >= 3, segs
    first_seg = segs[0]
    size = first_seg.stat().st_size
    with open(first_seg, "r+b") as fh:
        fh.truncate(size - 10)  # inside the second batch: offsets 10..19
    r = run_rq("offsets", "t", "--json", env=env)
    assert r.returncode == 5, r.stderr
    info = json.loads(r.stdout)
    assert (info["first"], info["end"], info["records"], info["lost"]) == (0, 60, 50, [[10, 19]]), info
    line = _one_line(r)
    assert f"truncated at byte {size - 10}): offsets 10..19 are lost" in line, line

    r = run_rq("offsets", "t", env=env)  # the human line counts them too
    assert r.returncode == 5 and b"50 records (10 lost)" in r.stderr + r.stdout, r.stderr
    replay = run_rq("replay", "t", "--skip-corrupt", "--format", "raw", env=env)
    assert len(replay.stdout.splitlines()) == 50, replay.stderr  # what offsets called readable


def test_offsets_of_a_whole_log_is_unchanged(tmp_path: Path) -> None:
    env, _ = _six_batches(tmp_path)
    r = run_rq("offsets", "t", "--json", env=env)
    assert r.returncode == 0 and "lost" not in json.loads(r.stdout), r.stderr
    assert json.loads(r.stdout)["records"] == 60


# -- 4. --skip-corrupt under --json ----------------------------------------------------------------


def _rotten_topic(tmp_path: Path) -> dict[str, str]:
    """Topic 'rot': values record-00000..record-00299, record 123 failing its CRC."""
    env = {"RQ_TOPICS_DIR": str(tmp_path / "topics")}
    r = run_rq("produce", "rot", input=b"".join(b"record-%05d\n" % i for i in range(300)), env=env)
    assert r.returncode == 0, r.stderr
    seg = next((tmp_path / "topics" / "rot").glob("*.log"))
    data = bytearray(seg.read_bytes())
    data[data.index(b"record-00123") + 8] ^= 0x01
    seg.write_bytes(bytes(data))
    return env


def test_skip_corrupt_skips_are_json_lines_and_counted(tmp_path: Path) -> None:
    """Skips were warnings on stderr only: a script reading --json saw a clean done line."""
    env = _rotten_topic(tmp_path)
    for cmd in (["replay", "rot", "--from", "start"], ["tail", "rot", "-n", "300"]):
        r = run_rq(*cmd, "--skip-corrupt", "--json", "--format", "raw", env=env)
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert len(lines) == 299 + 2 and b"record-00123" not in lines, lines[-3:]
        skipped, done = json.loads(lines[-2]), json.loads(lines[-1])
        assert skipped["event"] == "skipped" and (skipped["first"], skipped["last"]) == (123, 123), skipped
        assert skipped["reason"] == "corrupt" and skipped["where"].startswith("segment "), skipped
        assert skipped["topic"] == done["topic"], skipped
        assert done["event"] == "done" and done["skipped"] == 1, done


def test_a_follow_tells_a_skip_when_it_happens_not_when_it_stops(tmp_path: Path) -> None:
    """`tail -f --skip-corrupt --json` printed its skip lines only once the follow stopped: a script
    watching a long follow never heard of them."""
    env = _rotten_topic(tmp_path)
    proc = popen_rq("tail", "rot", "-n", "300", "-f", "--skip-corrupt", "--json", "--format", "raw", env=env)
    lines: queue.Queue[bytes] = queue.Queue()
    assert proc.stdout is not None
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout or ()], daemon=True).start()
    seen: list[bytes] = []
    try:
        while not seen or not seen[-1].startswith(b"{"):
            seen.append(lines.get(timeout=30))  # bounded: the old code said nothing until stopped
        assert proc.poll() is None  # still following
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    skipped = json.loads(seen[-1])
    assert (skipped["event"], skipped["first"], skipped["last"]) == ("skipped", 123, 123), skipped
    assert [b"record-%05d\n" % i for i in range(123)] == seen[:123]  # the records before it came first
    rest = [lines.get(timeout=30) for _ in range(300 - 1 - len(seen) + 2)]  # records left, then done
    done = json.loads(rest[-1])
    assert done["event"] == "done" and done["skipped"] == 1 and done["error"] == "interrupted", done
    assert b"skipped" not in b"".join(rest[:-1])  # told once


# -- 6. an MQTT token or user name with an unencoded '/' -------------------------------------------


@pytest.mark.parametrize("url", ["mqtt://tok/en@host/t", "mqtts://tok/Zq9@127.0.0.1:1883/t/#"])
def test_an_mqtt_user_name_cut_at_its_slash_is_named_not_connected_to(url: str, tmp_path: Path) -> None:
    """It parsed as host 'tok' and a topic holding '@', and rq then tried to reach a host 'tok'."""
    r = run_rq("tail", url, "-n", "1", env=_env(tmp_path), timeout=20)
    assert r.returncode == 2, r.stderr
    line = _one_line(r)
    assert "must be percent-encoded" in line and "RQ_MQTT_USERNAME/RQ_MQTT_PASSWORD" in line, line
    assert "Zq9" not in r.stderr.decode() and "tok" not in line, line


def test_an_at_in_an_mqtt_topic_still_parses() -> None:
    from topics.sources.open import parse_topic

    for url, host, topic in [
        ("mqtt://127.0.0.1/dev/a@b/x", "127.0.0.1", "dev/a@b/x"),
        ("mqtt://broker.lan:1883/a@b", "broker.lan", "a@b"),
        ("mqtt://broker/a%40b/x", "broker", "a@b/x"),
    ]:
        ref = parse_topic(url, Path("/none"))
        assert (ref.host, ref.subject, ref.user) == (host, topic, None), url


def test_produce_refused_at_its_first_line_leaves_no_empty_topic(tmp_path: Path) -> None:
    env = _env(tmp_path)
    topics = Path(env["RQ_TOPICS_DIR"])
    r = run_rq("produce", "new", "--format", "json", "--json", input=b"not json\n", env=env)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.decode().strip().splitlines()) == 1, r.stderr
    done = json.loads(r.stdout.decode().strip().splitlines()[-1])
    assert done["event"] == "done" and done["records"] == 0 and "error" in done
    assert not (topics / "new").exists(), sorted(p.name for p in (topics / "new").iterdir())
    # the same input into a topic that exists still opens it first and appends nothing
    assert run_rq("produce", "old", input=b"", env=env).returncode == 0
    assert run_rq("produce", "old", "--format", "json", input=b"not json\n", env=env).returncode == 2
    assert (topics / "old").is_dir()
    # a good first line still makes the topic
    assert run_rq("produce", "new", "--format", "json", input=b'{"value": "a"}\n', env=env).returncode == 0
    r = run_rq("tail", "new", "-n", "1", "--format", "raw", env=env)
    assert r.returncode == 0 and r.stdout == b'"a"\n', r
