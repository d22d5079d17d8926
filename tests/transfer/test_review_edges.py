"""From the open items of earlier reviews (2026-11-24): what `rq -q recv` kept from a script, and
how a directory send treated names and refusals."""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
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


# root reads every file whatever its mode: drop the capabilities that allow it, as a user would run
AS_USER = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search",
           "--inh-caps", "-dac_override,-dac_read_search", "--"]  # fmt: skip


@pytest.mark.parametrize("kind", ["fifo", "device", "process-substitution"])
def test_a_source_that_is_not_a_regular_file_is_refused(tmp_path: Path, kind: str) -> None:
    """A FIFO, `<(tar c …)` or /dev/zero arrived as an empty file, reported verified (exit 0)."""
    if kind == "fifo":
        os.mkfifo(tmp_path / "ff")
        arg = str(tmp_path / "ff")
    else:
        arg = "/dev/zero" if kind == "device" else "<(head -c 1000 /dev/urandom)"
    cmd = " ".join(rq_cmd("send", arg, "rq://127.0.0.1:9", "--transport", "tcp"))
    res = subprocess.run(["bash", "-c", cmd], env=rq_env(), capture_output=True, timeout=60)
    assert res.returncode == ExitCode.NOT_FOUND, res.stderr
    assert b"is not a regular file" in res.stderr and res.stderr.count(b"\n") == 1, res.stderr


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
def test_a_directory_that_cannot_be_listed_fails_the_send_before_anything_moves(tmp_path: Path) -> None:
    """os.walk dropped it without a word: the checkpoint went without its files, exit 0, verified."""
    ckpt = tmp_path / "ckpt"
    (ckpt / "open").mkdir(parents=True)
    (ckpt / "open" / "f").write_bytes(b"a")
    (ckpt / "locked").mkdir()
    (ckpt / "locked" / "g").write_bytes(b"b")
    os.chmod(ckpt / "locked", 0)
    os.chmod(tmp_path, 0o755)
    try:
        res = subprocess.run(
            [*AS_USER, *rq_cmd("send", str(ckpt), "rq://127.0.0.1:9", "--transport", "tcp")],
            env=rq_env(),
            capture_output=True,
            timeout=60,
        )
    finally:
        os.chmod(ckpt / "locked", 0o755)
    assert res.returncode == ExitCode.AUTH, res.stderr
    assert f"cannot list {ckpt / 'locked'}: Permission denied".encode() in res.stderr, res.stderr


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
def test_an_unreadable_file_says_so_without_a_rerun_hint(tmp_path: Path) -> None:
    """It was exit 5 'cannot be read any more … re-run the same command; changed or corrupt parts
    are sent again': it never was readable, and no re-run helps."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "secret").write_bytes(b"s")
    os.chmod(ckpt / "secret", 0)
    os.chmod(tmp_path, 0o755)
    recv = Recv(tmp_path / "dst", tmp_path / "cert", "tcp").start()
    try:
        res = subprocess.run(
            [*AS_USER, *rq_cmd("send", str(ckpt), recv.url, *recv.send_args())],
            env=rq_env(),
            capture_output=True,
            timeout=60,
        )
    finally:
        recv.stop()
        os.chmod(ckpt / "secret", 0o644)
    err = res.stderr.decode()
    assert res.returncode == ExitCode.AUTH, err
    assert f"cannot read {ckpt / 'secret'}: Permission denied" in err and "re-run" not in err, err


def test_a_tree_a_thousand_levels_deep_is_sent(tmp_path: Path) -> None:
    """Python 3.11's os.walk recurses: RecursionError, 'unexpected error', exit 1."""
    deep = tmp_path / "src" / "deep"
    deep.mkdir(parents=True)
    for _ in range(1100):  # (os.makedirs and Path.mkdir(parents=True) recurse too)
        deep = deep / "a"
        deep.mkdir()
    (deep / "leaf").write_bytes(b"x")
    recv = Recv(tmp_path / "dst", tmp_path / "cert", "tcp", "--once").start()
    try:
        proc = send([tmp_path / "src" / "deep"], recv)
        assert proc.returncode == ExitCode.OK, proc.stderr.decode()[-500:]
        assert recv.wait()[0] == ExitCode.OK
        assert (tmp_path / "dst" / "deep" / "/".join(["a"] * 1100) / "leaf").read_bytes() == b"x"
    finally:
        recv.stop()
        for top in (tmp_path / "src" / "deep", tmp_path / "dst" / "deep"):
            _remove_deep(top)


def _remove_deep(top: Path) -> None:
    """shutil.rmtree recurses too (pytest's own clean-up of old tmp dirs would fail on these):
    down the chain of directories once, then up, removing."""
    chain: list[Path] = []
    path: Path | None = top
    while path is not None and path.is_dir():
        chain.append(path)
        below = None
        for entry in path.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                below = entry
            else:
                entry.unlink()
        path = below
    for directory in reversed(chain):
        directory.rmdir()


@pytest.mark.parametrize("removed", [".rq-partial", "DEST"])
def test_a_receiver_that_stays_up_survives_its_state_being_removed(tmp_path: Path, removed: str) -> None:
    """`rm -r DEST/.rq-partial` with no transfer running is documented to forget what arrived;
    the receiver kept its descriptor of the removed directory and refused every later transfer
    ('receiver cannot write …manifest.json.tmp…: No such file or directory') until restarted."""
    src = tmp_path / "src" / "ck"
    src.mkdir(parents=True)
    (src / "w.bin").write_bytes(os.urandom(200_000))
    dst = tmp_path / "dst"
    recv = Recv(dst, tmp_path / "cert", "tcp").start()
    try:
        assert send([src], recv).returncode == ExitCode.OK
        shutil.rmtree(dst / ".rq-partial" if removed == ".rq-partial" else dst)
        if removed == ".rq-partial":
            shutil.rmtree(dst / "ck")
        again = send([src], recv)
        assert again.returncode == ExitCode.OK, again.stderr.decode()
        assert summary(again)["bytes_raw"] == 200_000  # forgotten: sent whole again
    finally:
        recv.stop()
    assert (dst / "ck" / "w.bin").read_bytes() == (src / "w.bin").read_bytes()
