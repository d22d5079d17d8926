"""Every record published to JetStream is confirmed, and what the stream did with it is counted.

The sink used to send a batch as core publishes and ask for the server's answer only for the last
record (and records with control headers): a record a stream with limits under discard policy
`new` refused in the middle of a batch was lost without a word (`rq produce` exit 0, "5 records,
offsets 0..4" with 4 stored). And a record the stream took as a duplicate (its Nats-Msg-Id in the
dedup window) counted as produced: 3 records with one id were "records 3, offsets -1..1" with 1
stored. Real nats-server, real streams."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jskit import MakeStream, made_streams
from rqtest import run_rq

from topics.errors import PublishRefused
from topics.sources import Appended, open_sink, parse_topic


@pytest.fixture
def streams(nats_url: str) -> Iterator[MakeStream]:
    """make(**config) adds a stream (subjects NAME.x) and returns its name; all are deleted
    afterwards."""
    with made_streams(nats_url, "h-confirm") as make:
        yield make


def _values(nats_url: str, stream: str) -> list[Any]:
    r = run_rq("replay", f"{nats_url}/{stream}", "--from", "start", "--format", "json")
    assert r.returncode == 0, r.stderr
    return [json.loads(line)["value"] for line in r.stdout.splitlines()]


def _full(**limits: Any) -> dict[str, Any]:
    from nats.js.api import DiscardPolicy

    return {"discard": DiscardPolicy.NEW, **limits}


@pytest.mark.integration
def test_a_record_a_full_stream_refuses_in_the_middle_of_a_batch_fails_the_produce(
    nats_url: str, streams: Any
) -> None:
    """max_bytes with discard new: the third record does not fit, the small ones after it do. The
    old sink heard only the last record's answer: exit 0, 'produced 5 records (offsets 0..4)'."""
    stream = streams(**_full(max_bytes=2000))
    data = b"a\nb\n" + b"x" * 3000 + b"\nc\nd\n"
    r = run_rq("produce", "--json", f"{nats_url}/{stream}/{stream}.x", input=data)
    assert r.returncode == 1, r.stderr
    err = r.stderr.decode().strip()
    assert len(err.splitlines()) == 1, err
    assert "refused record 3 of the input" in err and "maximum bytes exceeded" in err, err
    assert "2 record(s) before it are stored" in err and "is the server running" not in err, err
    done = json.loads(r.stdout.splitlines()[-1])
    # what the stream holds: the two after the refused one were removed again
    assert (done["event"], done["records"], done["first_offset"], done["last_offset"]) == ("done", 2, 1, 2)
    assert "maximum bytes exceeded" in done["error"], done
    assert _values(nats_url, stream) == ["a", "b"]


@pytest.mark.integration
def test_a_refusal_is_named_by_its_place_in_the_input_across_batches(nats_url: str, streams: Any) -> None:
    """20,000 records (three batches, several answer windows) into a stream that holds 10,000:
    the first refused is record 10,001 of the input, and nothing after the window it was in goes
    out. The old sink: exit 6 'is the server running', the refusal of the last record read as an
    outage."""
    stream = streams(**_full(max_msgs=10_000))
    data = b"".join(b"%d\n" % i for i in range(20_000))
    r = run_rq("produce", "--json", f"{nats_url}/{stream}/{stream}.x", input=data)
    assert r.returncode == 1, r.stderr
    err = r.stderr.decode().strip()
    assert len(err.splitlines()) == 1 and "refused record 10001 of the input" in err, err
    assert "maximum messages exceeded" in err and "10000 record(s) before it are stored" in err, err
    acks = [json.loads(line) for line in r.stdout.splitlines()]
    done = acks.pop()
    assert (done["records"], done["first_offset"], done["last_offset"]) == (10_000, 1, 10_000), done
    assert sum(a["records"] for a in acks) == 8192  # the one whole batch acknowledged before
    values = _values(nats_url, stream)
    assert values == list(range(10_000))


@pytest.mark.integration
def test_a_copy_names_the_refused_record_by_its_source_offset(
    nats_url: str, streams: Any, tmp_path: Path
) -> None:
    stream = streams(**_full(max_bytes=2000))
    env = {"RQ_TOPICS_DIR": str(tmp_path / "topics")}
    data = b"a\nb\n" + b"x" * 3000 + b"\nc\nd\n"
    assert run_rq("produce", "src", input=data, env=env).returncode == 0
    r = run_rq("replay", "src", "--to-topic", f"{nats_url}/{stream}/{stream}.x", "--json", env=env)
    assert r.returncode == 1, r.stderr
    err = r.stderr.decode().strip()
    assert len(err.splitlines()) == 1 and "refused the record at offset 2," in err, err
    assert "maximum bytes exceeded" in err, err
    assert _values(nats_url, stream) == ["a", "b"]


@pytest.mark.integration
def test_duplicates_are_counted_apart_from_the_records_stored(nats_url: str, streams: Any) -> None:
    stream = streams()
    url = f"{nats_url}/{stream}/{stream}.x"
    r = run_rq("produce", "--json", url, "--header", "Nats-Msg-Id=same", input=b"a\nb\nc\n")
    assert r.returncode == 0, r.stderr
    ack, done = (json.loads(line) for line in r.stdout.splitlines())
    for line in (ack, done):
        assert (line["records"], line["duplicates"]) == (1, 2), line
        assert (line["first_offset"], line["last_offset"]) == (1, 1), line
    # again: the id is still in the window, nothing is stored; the human line says so
    r = run_rq("produce", url, "--header", "Nats-Msg-Id=same", input=b"d\n")
    assert r.returncode == 0, r.stderr
    err = r.stderr.decode()
    assert err.startswith("produced 0 records to ") and "1 more were duplicates" in err, err
    assert "offsets" not in err, err
    assert _values(nats_url, stream) == ["a"]


@pytest.mark.integration
def test_a_copy_counts_the_duplicates_its_target_did_not_store(
    nats_url: str, streams: Any, tmp_path: Path
) -> None:
    stream = streams()
    env = {"RQ_TOPICS_DIR": str(tmp_path / "topics")}
    lines = b"".join(b'{"value": %d, "headers": {"Nats-Msg-Id": "id-%d"}}\n' % (n, n) for n in range(3))
    assert run_rq("produce", "src", "--format", "json", input=lines, env=env).returncode == 0
    target = f"{nats_url}/{stream}/{stream}.x"
    for stored, duplicates in ((3, 0), (0, 3)):  # the second copy: every id already seen
        r = run_rq("replay", "src", "--to-topic", target, "--json", env=env)
        assert r.returncode == 0, r.stderr
        done = json.loads(r.stdout.splitlines()[-1])
        assert (done["records"], done["stored"], done["duplicates"]) == (3, stored, duplicates), done
        assert ("3 of the 3 records copied" in r.stderr.decode()) == bool(duplicates), r.stderr
    assert _values(nats_url, stream) == [0, 1, 2]


@pytest.mark.integration
def test_the_library_sink_says_what_it_stored(nats_url: str, streams: Any, tmp_path: Path) -> None:
    """Sink.append returns Appended (offsets stored, counts); a refusal is PublishRefused with
    the record's place in the batch and what the batch stored nonetheless."""
    stream = streams(**_full(max_msgs=2))
    sink = open_sink(parse_topic(f"{nats_url}/{stream}/{stream}.x", tmp_path))
    try:
        ids = ((("Nats-Msg-Id", b"k"),), (("Nats-Msg-Id", b"k"),), ())
        assert sink.append([(None, None, h, b"v") for h in ids]) == Appended(1, 2, 2, 1)
        with pytest.raises(PublishRefused) as refused:
            sink.append([(None, None, (), b"w")])
        assert refused.value.index == 0 and refused.value.appended == Appended(None, None, 0, 0)
        assert "refused record 1 of the batch" in str(refused.value)
    finally:
        sink.close()
    embedded = open_sink(parse_topic(str(tmp_path / "log"), tmp_path))
    try:
        assert embedded.append([(None, None, (), b"v")] * 2) == Appended(0, 1, 2, 0)
    finally:
        embedded.close()
