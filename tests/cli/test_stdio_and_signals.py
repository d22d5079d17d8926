"""rq inside scripts: closed or departed standard streams, SIGHUP, and signals the parent ignored.

- `rq preload … | head -n1`: the reader left while rq still had work; rq finished it and exited
  with its own code (it stopped, exit 0: a cut-short preload read as success under pipefail).
- `2>&-` / `>&-`: a closed stream is /dev/null to rq (warnings landed in stdout's data; the first
  `.write()` on the missing stream was an AttributeError, exit 1).
- SIGHUP (ssh gone) is answered like SIGTERM: exit 130, `done`/summary line (it killed rq, 129).
- A SIGINT the parent left ignored stays ignored (background jobs of non-interactive shells).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from rqtest import rq_command, wait_or_fail


def _source(tmp_path: Path, count: int) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(count):
        (src / f"f{i:04d}").write_bytes(os.urandom(4096))
    # a name that is not UTF-8: a `failed` line early in the run, and exit 1 at its end
    (src / os.fsdecode(b"x\xffy")).write_bytes(b"z")
    return src


def _cached(cache: Path) -> int:
    out = subprocess.run(
        [*rq_command(), "cache", "ls", "--cache-dir", str(cache)], capture_output=True, check=True
    )
    return len(out.stdout.splitlines())


def test_preload_finishes_its_work_when_the_reader_of_stdout_leaves(tmp_path: Path) -> None:
    src, cache = _source(tmp_path, 300), tmp_path / "cache"
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before rq writes its first line
    proc = subprocess.Popen(
        [*rq_command(), "preload", f"{src}/", "--cache-dir", str(cache), "--json"],
        stdout=write_end,
        stderr=subprocess.PIPE,
        env={**os.environ, "CI": "1"},
    )
    os.close(write_end)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err  # the bad name's failure, not 0
    assert b"1 of 301 objects failed" in err and b"Traceback" not in err
    assert _cached(cache) == 300


def test_closed_stdout_and_stderr_are_no_errors_and_warnings_never_reach_stdout(tmp_path: Path) -> None:
    src, cache = _source(tmp_path, 3), tmp_path / "cache"
    args = [*rq_command(), "preload", f"{src}/", "--cache-dir", str(cache), "--json"]
    # stderr closed: stdout carries only the JSON lines (the error line went there)
    no_err = subprocess.run(
        args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=False, preexec_fn=lambda: os.close(2)
    )
    assert no_err.returncode == 1
    assert [json.loads(x)["event"] for x in no_err.stdout.splitlines()] == ["failed", "summary"]
    # stdout closed: the work done, then one line naming stdout and exit 1 (as `cat >&-`), no traceback
    (src / os.fsdecode(b"x\xffy")).unlink()
    no_out = subprocess.run(
        args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False, preexec_fn=lambda: os.close(1)
    )
    assert no_out.returncode == 1, no_out.stderr
    assert no_out.stderr == b"rq: error: cannot write to stdout: Bad file descriptor\n"
    assert _cached(cache) == 3


def _follower(tmp_path: Path, ignore_int: bool = False) -> subprocess.Popen[bytes]:
    topics = tmp_path / "topics"
    subprocess.run(
        [*rq_command(), "produce", "t", "--topics-dir", str(topics)],
        input=b"one\n",
        check=True,
        capture_output=True,
    )

    def ignore() -> None:
        # as a login shell starts a job: a test run under nohup (SIGHUP ignored, which rq keeps)
        # must not make rq ignore the SIGHUP this test sends
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        if ignore_int:
            signal.signal(signal.SIGINT, signal.SIG_IGN)

    proc = subprocess.Popen(
        [*rq_command(), "tail", "t", "-f", "-n", "1", "--topics-dir", str(topics), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "CI": "1"},
        preexec_fn=ignore,
    )
    assert proc.stdout is not None
    assert json.loads(proc.stdout.readline())["value"] == "one"  # following now
    return proc


def test_sighup_stops_a_command_like_sigterm(tmp_path: Path) -> None:
    proc = _follower(tmp_path)
    proc.send_signal(signal.SIGHUP)
    rc = wait_or_fail(proc, 30, "rq tail -f still running after SIGHUP")
    out, err = proc.communicate()
    assert rc == 130, err
    assert json.loads(out.splitlines()[-1])["error"] == "stopped by SIGHUP"
    assert err.decode().splitlines()[-1] == "rq: stopped by SIGHUP"


def test_a_sigint_the_parent_ignored_stays_ignored(tmp_path: Path) -> None:
    proc = _follower(tmp_path, ignore_int=True)
    proc.send_signal(signal.SIGINT)
    time.sleep(1.0)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGTERM)
    assert wait_or_fail(proc, 30, "rq tail -f still running after SIGTERM") == 130


def test_recv_serves_when_the_reader_of_its_stdout_left(tmp_path: Path) -> None:
    """`rq recv --json | head -n1`: the receiver's later lines come from its channel threads, where
    click has no context, so the broken pipe was taken for a destination that cannot be written:
    every transfer refused ('Broken pipe', send exit 1) and `--once` never ended."""
    src = tmp_path / "ck.bin"
    src.write_bytes(os.urandom(200_000))
    env = {**os.environ, "CI": "1", "RQ_TOKEN": "t"}
    recv = subprocess.Popen(
        [
            *rq_command(),
            "recv",
            str(tmp_path / "dst"),
            "--transport",
            "tcp",
            "--listen",
            "127.0.0.1:0",
            "--once",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        _send_to(recv, src, env)
    finally:
        if recv.poll() is None:  # a failed assertion must not leave the receiver behind
            recv.kill()
            recv.wait()
    assert (tmp_path / "dst" / "ck.bin").read_bytes() == src.read_bytes()


def _send_to(recv: subprocess.Popen[bytes], src: Path, env: dict[str, str]) -> None:
    assert recv.stdout is not None
    line = json.loads(recv.stdout.readline())  # the listening line: then the reader leaves
    recv.stdout.close()
    send = subprocess.run(
        [*rq_command(), "send", str(src), line["address"].join(["rq://", ""]), "--transport", "tcp"],
        capture_output=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert send.returncode == 0, send.stderr
    assert wait_or_fail(recv, 30, "rq recv --once still running after its transfer") == 0
