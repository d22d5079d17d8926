"""A saved replay spec never silently differs from what the run delivered (sp's review):

- a stop (SIGTERM) that cuts a write to a stalled reader, with and without --follow: the spec pins
  exactly the records wholly written out (count and digest of that prefix), and the --json done
  line still reaches the reader, on a line of its own;
- a reader that leaves (`| head -3`): the spec of what was written out replaces an older file at
  that path, and stderr says so;
- the library refuses a `stop=` below records already digested, and stores an embedded source's
  path absolute; `--spec` with `--save-spec` is refused (exit 2).

Real rq processes; the records' values are their offsets + 1, so what arrived is known line by
line."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import orjson
import pytest
from rqtest import popen_rq, run_rq

from topics.errors import SpecError
from topics.pipeline import Request, run
from topics.savedspec import ReplaySpec
from topics.sources.embedded import EmbeddedSource

_RECORDS = 5000


def _topic(tmp_path: Path) -> dict[str, str]:
    env = {"RQ_TOPICS_DIR": str(tmp_path / "topics")}
    data = b"".join(b"%d\n" % (i + 1) for i in range(_RECORDS))
    out = run_rq("produce", "ev", input=data, env=env)
    assert out.returncode == 0, out.stderr
    return env


def _stale(path: Path) -> bytes:
    """An older spec at the path: a later --spec must never take it for this run."""
    old = {
        "rq_replay_spec": 1,
        "source": "/nowhere/old",
        "kind": "embedded",
        "start": 7,
        "stop": 8,
        "records": 1,
        "digest": "xxh3_128:00",
    }
    data = orjson.dumps(old)
    path.write_bytes(data)
    return data


@pytest.mark.parametrize("follow", [True, False], ids=["follow", "bounded"])
def test_sigterm_cutting_a_stalled_write_pins_what_was_written(tmp_path: Path, follow: bool) -> None:
    env = _topic(tmp_path)
    spec = tmp_path / "t2.json"
    _stale(spec)
    args = ["--json", "replay", "ev", "--from", "0", "--save-spec", str(spec), "--format", "json"]
    proc = popen_rq(*args, *(["-f"] if follow else []), env=env)
    assert proc.stdout is not None and proc.stderr is not None
    got: list[bytes] = []

    def slow_reader() -> None:  # the reviewer's slow.py: a line, then 2 ms
        assert proc.stdout is not None
        for line in proc.stdout:
            got.append(line)
            time.sleep(0.002)

    reader = threading.Thread(target=slow_reader)
    reader.start()
    time.sleep(1.5)
    assert proc.poll() is None, proc.stderr.read()
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(60)
    reader.join(60)
    err = proc.stderr.read().decode()
    proc.stderr.close()
    proc.stdout.close()
    assert rc == 130, err
    records = [orjson.loads(line) for line in got if line.endswith(b"\n") and b'"offset"' in line]
    assert records, err
    assert [r["offset"] for r in records] == list(range(len(records)))
    assert len(records) < _RECORDS  # the write was cut, not finished
    saved = json.loads(spec.read_text())
    assert (saved["start"], saved["stop"], saved["records"]) == (0, len(records), len(records)), err
    assert saved["last_offset"] == len(records) - 1
    assert f"pins those {len(records)}" in err
    # the done line came last, on a line of its own, counting the same records
    done = json.loads(got[-1])
    assert done["event"] == "done" and done["error"] == "stopped by SIGTERM"
    assert done["records"] == len(records) and done["last_offset"] == len(records) - 1
    # and the spec reproduces exactly those records
    again = run_rq("replay", "--spec", str(spec), "--format", "json", env=env)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines(keepends=True) == [line for line in got if b'"offset"' in line]


def test_reader_that_leaves_replaces_an_older_spec(tmp_path: Path) -> None:
    env = _topic(tmp_path)
    spec = tmp_path / "h.json"
    old = _stale(spec)
    proc = popen_rq("replay", "ev", "--from", "0", "--save-spec", str(spec), "--format", "json", env=env)
    assert proc.stdout is not None and proc.stderr is not None
    first = [proc.stdout.readline() for _ in range(3)]  # `| head -3`
    proc.stdout.close()
    rc = proc.wait(60)
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert rc == 0, err
    assert spec.read_bytes() != old, "the older spec was left in place without a word"
    saved = json.loads(spec.read_text())
    assert saved["start"] == 0 and saved["records"] >= 3
    assert saved["stop"] == saved["records"] == saved["last_offset"] + 1
    assert f"stdout's reader left after {saved['records']} record(s) were written out" in err
    again = run_rq("replay", "--spec", str(spec), "--format", "json", env=env)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines(keepends=True)[:3] == first
    assert len(again.stdout.splitlines()) == saved["records"]


def test_spec_and_save_spec_together_are_refused(tmp_path: Path) -> None:
    env = _topic(tmp_path)
    spec = tmp_path / "s.json"
    assert run_rq("replay", "ev", "--from", "0:10", "--save-spec", str(spec), env=env).returncode == 0
    out = run_rq("replay", "--spec", str(spec), "--save-spec", str(tmp_path / "t.json"), env=env)
    assert out.returncode == 2
    assert b"--spec and --save-spec are alternatives" in out.stderr
    assert not (tmp_path / "t.json").exists()


def _read(source: EmbeddedSource, stop: int) -> tuple[Request, object]:
    req = Request(start=0, stop=stop, digest=True)
    return req, run(source, req, lambda _r, _d: None)


def test_from_result_refuses_a_stop_below_the_records_digested(tmp_path: Path) -> None:
    env = _topic(tmp_path)
    source = EmbeddedSource(Path(env["RQ_TOPICS_DIR"]) / "ev")
    try:
        req, res = _read(source, 100)
        with pytest.raises(SpecError, match="stop=50"):
            ReplaySpec.from_result(source, req, res, stop=50)  # type: ignore[arg-type]
        with pytest.raises(SpecError):
            ReplaySpec.from_result(source, req, res, stop=99)  # type: ignore[arg-type]
        spec = ReplaySpec.from_result(source, req, res, stop=100)  # type: ignore[arg-type]
        assert (spec.stop, spec.records, spec.last_offset) == (100, 100, 99)
    finally:
        source.close()


def test_from_result_stores_an_embedded_source_absolute(tmp_path: Path) -> None:
    _topic(tmp_path)
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        source = EmbeddedSource(Path("topics/ev"))
        try:
            req, res = _read(source, 10)
            spec = ReplaySpec.from_result(source, req, res)  # type: ignore[arg-type]
        finally:
            source.close()
    finally:
        os.chdir(here)
    assert spec.source == str(tmp_path / "topics" / "ev")
    assert Path(spec.source).is_absolute()
