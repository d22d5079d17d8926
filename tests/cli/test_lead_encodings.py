"""rq under a locale whose encoding is not UTF-8, and a stdout that is not UTF-8 (found by a review
of encodings): names were read in the locale's encoding (`rq send` renamed `café` to `cafÃ©` on the
receiver, preload indexed keys a UTF-8 process could not find or refused every non-ASCII name), and
--json or text output with a character stdout could not encode ended the command with exit 1 after
its work was done. rq now runs in Python's UTF-8 mode whatever the locale, writes --json as UTF-8
bytes (undecodable bytes of a name as \\xNN) and escapes what a text stdout cannot take."""

from __future__ import annotations

import json
import os
from pathlib import Path

from rqtest import run_rq

# the C locale with Python's own UTF-8 remedies turned off: file system encoding ASCII
NOT_UTF8 = {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}


def _tree(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / "café.txt").write_bytes(b"x")
    (src / "plain.txt").write_bytes(b"y")
    return src


def test_names_are_read_as_utf8_whatever_the_locale(tmp_path: Path) -> None:
    src, cache = _tree(tmp_path), str(tmp_path / "c")
    r = run_rq("preload", f"{src}/", "--cache-dir", cache, "--tier", "disk", "-q", env=NOT_UTF8)
    assert r.returncode == 0, r.stderr  # was exit 1: "file name is not valid UTF-8" for café.txt
    r = run_rq("cache", "stat", str(src / "café.txt"), "--cache-dir", cache)  # a UTF-8 process finds it
    assert r.returncode == 0, r.stderr


def test_json_and_text_on_an_ascii_stdout(tmp_path: Path) -> None:
    src, cache = _tree(tmp_path), str(tmp_path / "c")
    assert run_rq("preload", f"{src}/", "--cache-dir", cache, "-q").returncode == 0
    ascii_out = {"PYTHONIOENCODING": "ascii"}
    r = run_rq("--json", "cache", "ls", "--cache-dir", cache, env=ascii_out)
    assert r.returncode == 0, r.stderr  # was exit 1: UnicodeEncodeError
    lines = [json.loads(line) for line in r.stdout.decode("utf-8").splitlines()]
    urls = [e["url"] for e in lines if "url" in e]
    assert str(src / "café.txt") in urls
    r = run_rq("cache", "ls", "--cache-dir", cache, env=ascii_out)
    assert r.returncode == 0, r.stderr
    assert b"caf\\xe9.txt" in r.stdout


def test_json_of_a_topic_whose_name_is_not_utf8_escapes_it(tmp_path: Path) -> None:
    topic = os.fsdecode(bytes(tmp_path) + b"/bad\xff")
    r = run_rq("produce", "--json", topic, input=b"e\n")
    assert r.returncode == 0, r.stderr  # was exit 1 after the record was stored: orjson's TypeError
    done = json.loads(r.stdout.decode("utf-8").splitlines()[-1])
    assert done["event"] == "done" and done["records"] == 1 and done["topic"].endswith("/bad\\xff")


def test_times_shown_say_their_zone(tmp_path: Path) -> None:
    """`rq cache stat` printed local time without its offset (ambiguous across zones and in a DST
    overlap) and the record table UTC without saying so."""
    src, cache = _tree(tmp_path), str(tmp_path / "c")
    assert run_rq("preload", f"{src}/", "--cache-dir", cache, "-q").returncode == 0
    r = run_rq("cache", "stat", str(src / "plain.txt"), "--cache-dir", cache, env={"TZ": "Asia/Kolkata"})
    assert r.returncode == 0, r.stderr
    created = next(line for line in r.stdout.decode().splitlines() if line.startswith("created"))
    assert created.endswith("+0530"), created
    env = {"RQ_TOPICS_DIR": str(tmp_path / "t")}
    assert run_rq("produce", "ev", "-q", input=b"a\n", env=env).returncode == 0
    r = run_rq("replay", "ev", "--format", "table", env=env)
    assert r.returncode == 0, r.stderr
    row = r.stdout.decode().splitlines()[-1].split("\t")
    assert row[1].endswith("Z"), row
