"""rq under a locale whose encoding is not UTF-8, and a stdout that is not UTF-8 (found by a review
of encodings): names were read in the locale's encoding (`rq send` renamed `café` to `cafÃ©` on the
receiver, preload indexed keys a UTF-8 process could not find or refused every non-ASCII name), and
--json or text output with a character stdout could not encode ended the command with exit 1 after
its work was done. rq now runs in Python's UTF-8 mode whatever the locale, writes --json as UTF-8
bytes (undecodable bytes of a name as \\xNN) and escapes what a text stdout cannot take."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rqtest import popen_rq, run_rq

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


def test_a_script_read_from_stdin_that_calls_main_runs_once(tmp_path: Path) -> None:
    """The re-exec ran `python -` again, whose script on stdin was used up: rq never ran, exit 0
    (a second diff review). Only the rq script and `python -m rqcli` start again."""
    r = subprocess.run(
        [sys.executable, "-", "--version"],
        input=b"from rqcli.console import main; main()\n",
        env={**os.environ, **NOT_UTF8},
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0 and b"rq, version" in r.stdout, (r.stdout, r.stderr)


def test_text_keeps_the_locales_encoding_and_signals_are_let_through(tmp_path: Path) -> None:
    """After the re-exec, text on stdout is still in the locale's encoding (here ASCII: escaped),
    not UTF-8 a Latin-1 terminal would show as mojibake; the signals blocked across the exec are
    let through once rq holds them (a stuck mask would make rq deaf to Ctrl-C)."""
    env = {**NOT_UTF8, "RQ_TOPICS_DIR": str(tmp_path)}
    assert run_rq("produce", "./t", "-q", input="héllo\n".encode(), env=env, cwd=tmp_path).returncode == 0
    r = run_rq("replay", "./t", "--format", "table", env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert b"h\\xe9llo" in r.stdout, r.stdout
    proc = popen_rq("tail", str(tmp_path / "t"), "-f", "-q", env={**os.environ, **env})
    try:
        status = Path(f"/proc/{proc.pid}/status")

        def held() -> bool:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
            return int(fields["SigCgt"], 16) & (1 << (signal.SIGTERM - 1)) != 0

        deadline = time.monotonic() + 30
        while not held() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert held()
        blocked = next(line for line in status.read_text().splitlines() if line.startswith("SigBlk"))
        assert int(blocked.split()[1], 16) == 0, blocked
    finally:
        proc.terminate()
        proc.wait(30)
