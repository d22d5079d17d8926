"""og's review of consumer groups and offsets: times past the server's int64 nanoseconds, foreign
durable consumers with names no rq group has, a damaged embedded group hiding the listing, the lag
of a JetStream group with nothing committed, group names with a final newline or rq's own prefix."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jskit import made_streams
from rqtest import js_call, run_rq
from test_jetstream import publish

pytestmark = pytest.mark.integration


@pytest.fixture
def stream(services: Any) -> Iterator[tuple[str, str]]:
    """(nats url, stream name) of a stream capturing NAME.> on the lead's nats-server."""
    with made_streams(services.nats_url, "gr_off") as make:
        yield services.nats_url, make(subjects=["{name}.>"])


def _json(r: Any) -> Any:
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


# -- 1. a time past 2262-04-11 (int64 nanoseconds) is past every record: the end -----------------


@pytest.mark.parametrize("when", ["@2262-04-12", "@3000-01-01", "@9999-12-31"])
def test_time_past_int64_nanoseconds_resolves_to_the_end(stream: tuple[str, str], when: str) -> None:
    url, name = stream
    publish(url, f"{name}.a", [b"1", b"2", b"3"])
    topic = f"{url}/{name}/{name}.a"
    r = _json(run_rq("offsets", "reset", topic, "--group", "g", "--to", when, "--dry-run", "--json"))
    assert r["after"] == 4  # was 1: the server's start time wrapped round to before every record


def test_replay_to_a_time_past_2262_reads_every_record(stream: tuple[str, str]) -> None:
    url, name = stream
    publish(url, f"{name}.a", [b"1", b"2", b"3"])
    r = run_rq(
        "replay", f"{url}/{name}/{name}.a", "--from", "start", "--to", "@3000-01-01", "--format", "raw"
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [b"1", b"2", b"3"]  # was none: the end resolved to the start


# -- 2. a foreign durable consumer named as no rq group can be ----------------------------------


@pytest.mark.parametrize("odd", ["a\x1b[31mred", "é-x", "a$b"])
def test_foreign_consumer_with_an_odd_name_is_skipped_not_fatal(stream: tuple[str, str], odd: str) -> None:
    from nats.js.api import ConsumerConfig

    url, name = stream
    subject = f"{name}.a"
    publish(url, subject, [b"1", b"2"])
    topic = f"{url}/{name}/{subject}"
    assert run_rq("replay", topic, "--group", "mine", "--commit", "--format", "raw").returncode == 0
    js_call(
        url,
        lambda js: js.add_consumer(
            name, ConsumerConfig(durable_name=odd, filter_subject=subject, ack_policy="explicit")
        ),
    )
    r = run_rq("offsets", topic, "--json")
    assert r.returncode == 0, r.stderr  # was exit 2 "bad group name … for JetStream", nothing printed
    assert [g["group"] for g in json.loads(r.stdout)["groups"]] == ["mine"]
    err = r.stderr.decode()
    assert "skipped consumer" in err and "\x1b" not in err


# -- 3. one damaged embedded group file: the listing still shows the topic and the good groups ----


def test_damaged_group_is_marked_and_the_rest_listed(tmp_path: Path) -> None:
    env = {"RQ_TOPICS_DIR": str(tmp_path)}
    assert run_rq("produce", "T", input=b"1\n2\n3\n", env=env).returncode == 0
    for g in ("bad", "good"):
        assert run_rq("replay", "T", "--group", g, "--commit", "--format", "raw", env=env).returncode == 0
    (tmp_path / "T" / "groups" / "bad.json").write_text('{"group":"bad","committed":1000000,"updated_ms":1}')
    r = run_rq("offsets", "T", "--json", env=env)
    assert r.returncode == 5, r.stderr
    got = json.loads(r.stdout)  # was empty stdout: the damaged file hid the whole listing
    assert got["records"] == 3
    rows = {g["group"]: g for g in got["groups"]}
    assert rows["good"] == {"group": "good", "committed": 3, "lag": 0}
    assert rows["bad"]["committed"] is None and "past the end" in rows["bad"]["damaged"]
    assert r.stderr.decode().count("\n") == 1 and "1000000" in r.stderr.decode()
    text = run_rq("offsets", "T", env=env)
    assert text.returncode == 5
    lines = text.stdout.decode().splitlines()
    assert lines[0].endswith("first 0, last 2, 3 records")
    assert any(ln.split() == ["bad", "damaged", "-"] for ln in lines)
    assert any(ln.split() == ["good", "3", "0"] for ln in lines)


# -- 5. the lag of a JetStream group with nothing committed: the topic's records --------------------


def test_lag_of_a_group_with_nothing_committed_counts_only_this_subject(stream: tuple[str, str]) -> None:
    url, name = stream
    publish(url, f"{name}.a", [b"1", b"2"])
    publish(url, f"{name}.other", [b"x"] * 5)
    seqs = publish(url, f"{name}.a", [b"3", b"4"])

    async def delete(js: Any) -> None:
        await js.delete_msg(name, seqs[0])

    js_call(url, delete)
    topic = f"{url}/{name}/{name}.a"
    assert _json(run_rq("offsets", topic, "--json"))["records"] == 3
    # a group named and never committed is exit 3 now (it was a row with committed null); one at
    # the start has the lag of this subject's records only (was 8: end - first)
    assert run_rq("offsets", topic, "--group", "new", "--json").returncode == 3
    assert run_rq("offsets", "reset", topic, "--group", "new", "--to", "start").returncode == 0
    got = _json(run_rq("offsets", topic, "--group", "new", "--json"))
    assert got["groups"] == [{"group": "new", "committed": 1, "lag": 3}]


# -- 6, 7. group names JetStream must refuse with exit 2 -------------------------------------------


@pytest.mark.parametrize("group", ["nl\n", "rq-moving-x"])
def test_bad_jetstream_group_names_are_usage_errors(stream: tuple[str, str], group: str) -> None:
    url, name = stream
    publish(url, f"{name}.a", [b"1"])
    topic = f"{url}/{name}/{name}.a"
    for args in (
        ("offsets", topic, "--group", group),
        ("offsets", "reset", topic, "--group", group, "--to", "start"),
        ("replay", topic, "--group", group, "--commit", "--format", "raw"),
    ):
        r = run_rq(*args)
        # was: "nl\n" exit 1 "unexpected ValueError: nats: invalid consumer name";
        # rq-moving-x accepted, a group never listed
        assert r.returncode == 2, (args, r.stderr)
        assert "bad group name" in r.stderr.decode()
    listed = _json(run_rq("offsets", topic, "--json"))
    assert listed["groups"] == []


# -- 8. reset clamps past the end / before the start, and says so --------------------------------


def test_reset_says_when_it_clamped(stream: tuple[str, str], tmp_path: Path) -> None:
    url, name = stream
    publish(url, f"{name}.a", [b"1", b"2", b"3", b"4"])

    async def purge(js: Any) -> None:
        await js.purge_stream(name, keep=2)

    js_call(url, purge)
    topic = f"{url}/{name}/{name}.a"
    for to, after, clamped in (("100", 5, "end"), ("1", 3, "start"), ("4", 4, None)):
        got = _json(run_rq("offsets", "reset", topic, "--group", "g", "--to", to, "--dry-run", "--json"))
        assert (got["after"], got["clamped"]) == (after, clamped)  # was: no "clamped" key
        line = run_rq("offsets", "reset", topic, "--group", "g", "--to", to, "--dry-run").stdout.decode()
        assert line.rstrip().endswith(
            f"to {after}" + (f" (clamped to the {clamped} {after})" if clamped else "")
        )
    env = {"RQ_TOPICS_DIR": str(tmp_path)}
    assert run_rq("produce", "T", input=b"1\n2\n", env=env).returncode == 0
    got = _json(run_rq("offsets", "reset", "T", "--group", "g", "--to", "9", "--json", env=env))
    assert got == {
        "topic": str(tmp_path / "T"),
        "group": "g",
        "before": None,
        "after": 2,
        "dry_run": False,
        "clamped": "end",
    }
