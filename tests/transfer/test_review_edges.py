"""From the open items of earlier reviews (2026-11-24): what `rq -q recv` kept from a script, and
how a directory send treated names and refusals."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from pathlib import Path

from xfer_kit import REPO, Recv, rq_cmd, rq_env, send, summary

from rqcli.exitcodes import ExitCode


def test_quiet_recv_still_prints_the_line_to_paste(tmp_path: Path) -> None:
    """With `--listen :0` that line is the only way a script learns the port; -q printed nothing."""
    env = rq_env()
    recv = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rqcli",
            "-q",
            "recv",
            str(tmp_path / "d"),
            "--listen",
            "127.0.0.1:0",
            "--transport",
            "tcp",
            "--once",
            "--cert-dir",
            str(tmp_path / "cert"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=REPO,
    )
    try:
        assert recv.stdout is not None
        ready, _, _ = select.select([recv.stdout], [], [], 30)
        assert ready, "rq -q recv printed nothing to learn its port from"
        line = recv.stdout.readline().decode()
        words = line.split()
        assert words[:3] == ["rq", "send", "SOURCE"] and words[3].startswith("rq://127.0.0.1:"), line
        assert not words[3].endswith(":0")
        (tmp_path / "f").write_bytes(b"payload")
        sent = subprocess.run(
            rq_cmd("send", str(tmp_path / "f"), *words[3:]), env=env, capture_output=True, timeout=60
        )
        assert sent.returncode == ExitCode.OK, sent.stderr
        out, err = recv.communicate(timeout=30)
        assert recv.returncode == ExitCode.OK, err
        assert out == b"" and err == b""  # nothing else: -q
        assert (tmp_path / "d" / "f").read_bytes() == b"payload"
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.wait()


def test_a_name_the_protocol_cannot_carry_is_skipped_not_the_whole_tree(tmp_path: Path) -> None:
    """A backslash (legal on Linux, refused by every receiver) aborted the whole directory send."""
    ckpt = tmp_path / "src" / "ckpt"
    ckpt.mkdir(parents=True)
    (ckpt / "w.bin").write_bytes(os.urandom(50_000))
    (ckpt / "a\\b").write_bytes(b"x")
    (ckpt / "bell\x07").write_bytes(b"y")
    (ckpt / "dir\\x").mkdir()
    with open(os.path.join(os.fsencode(ckpt), b"latin\xe9"), "wb") as fh:
        fh.write(b"not utf-8")
    (ckpt / "dir\\x" / "inner").write_bytes(b"z")
    recv = Recv(tmp_path / "dst", tmp_path / "cert", "tcp", "--once").start()
    try:
        proc = send([ckpt], recv)
        assert proc.returncode == ExitCode.OK, proc.stderr.decode()
        assert recv.wait()[0] == ExitCode.OK
    finally:
        recv.stop()
    lines = [json.loads(x) for x in proc.stdout.decode().splitlines()]
    skipped = sorted(Path(x["path"]).name for x in lines if x.get("event") == "skipped")
    assert skipped == ["a\\b", "bell\\x07", "dir\\x", "latin\\xe9"], skipped  # one for the dir
    assert summary(proc)["skipped"] == 4 and summary(proc)["files"] == 1
    assert "backslash not allowed" in proc.stderr.decode()
    assert (tmp_path / "dst" / "ckpt" / "w.bin").read_bytes() == (ckpt / "w.bin").read_bytes()
    assert {p.name for p in (tmp_path / "dst" / "ckpt").iterdir()} - {".rq-partial"} == {"w.bin"}


def test_a_directory_argument_whose_own_name_cannot_be_sent_is_refused(tmp_path: Path) -> None:
    ckpt = tmp_path / "ck\\pt"
    ckpt.mkdir()
    (ckpt / "f").write_bytes(b"x")
    res = subprocess.run(
        rq_cmd("send", str(ckpt), "rq://127.0.0.1:9", "--transport", "tcp"),
        env=rq_env(),
        capture_output=True,
        timeout=60,
    )
    assert res.returncode == ExitCode.FAILURE and b"backslash not allowed" in res.stderr, res.stderr
    assert len(res.stderr.decode().strip().splitlines()) == 1


def test_an_exists_refusal_names_every_file_in_the_way(tmp_path: Path) -> None:
    """It named the first only: moving it aside and re-running met the next, one re-run per file."""
    ckpt = tmp_path / "src" / "ck"
    ckpt.mkdir(parents=True)
    (tmp_path / "dst" / "ck").mkdir(parents=True)
    for i in range(8):
        (ckpt / f"f{i}").write_bytes(b"%d" % i)
        if i % 4:  # f1 f2 f3 f5 f6 f7 are in the way
            (tmp_path / "dst" / "ck" / f"f{i}").write_bytes(b"theirs")
    recv = Recv(tmp_path / "dst", tmp_path / "cert", "tcp").start()
    try:
        proc = send([ckpt], recv)
    finally:
        recv.stop()
    err = proc.stderr.decode()
    assert proc.returncode == ExitCode.EXISTS, err
    assert "ck/f1 already exists in the destination; also in the way: ck/f2, ck/f3, ck/f5 and 2 more" in err
    assert all((tmp_path / "dst" / "ck" / f"f{i}").read_bytes() == b"theirs" for i in (1, 2, 3, 5, 6, 7))
    assert not (tmp_path / "dst" / "ck" / "f0").exists()
