"""What rq send / rq recv tell an on-call reader from rq alone (dt): -v shows the library loggers'
messages; an interrupted send says what the receiver holds and that a re-run resumes; a resumed
or already complete send says so; files restarted because their source changed are named on both
sides; a full receiver disk is said once, without a --max-bytes hint; off a terminal a heartbeat
line says the run is alive."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from rqtest import popen_rq_with
from tmpfs_kit import own_tmpfs
from xfer_kit import REPO, Recv, interrupt_mid_send, rq_cmd, rq_env, send, summary

from rqcli.exitcodes import ExitCode
from rqcli.output import Output


@pytest.fixture
def receivers() -> Iterator[list[Recv]]:
    started: list[Recv] = []
    yield started
    for r in started:
        r.stop()


def _file(path: Path, mib: int) -> Path:
    with open(path, "wb") as fh:
        for _ in range(mib):
            fh.write(os.urandom(1 << 20))
    return path


def _communicate(proc: subprocess.Popen[bytes], timeout: float = 120) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out.decode(), err.decode()


# ------------------------------------------------------------------------------------------ 1: -v


def test_v_shows_the_library_loggers_on_stderr_in_one_line(tmp_path: Path) -> None:
    """transfer.quic logs dropped datagrams, transmit failures and the datagram fallback 'for rq
    -v', but rq installed no handler: -v showed nothing of them (INFO and DEBUG went nowhere)."""
    src = tmp_path / "f"
    src.write_bytes(b"x" * 1000)
    setup = (
        "import logging, transfer.sender as s\n"
        "o = s._resolve\n"
        "def r(h, p):\n"
        "    logging.getLogger('transfer.quic').info('probe info %s', h)\n"
        "    logging.getLogger('transfer.quic').debug('probe debug')\n"
        "    logging.getLogger('botocore.hooks').info('other library')\n"
        "    return o(h, p)\n"
        "s._resolve = r\n"
    )
    args = ("send", str(src), "rq://127.0.0.1:9", "--transport", "tcp", "--timeout", "0.5")
    env = rq_env()
    rc, out, err = _communicate(popen_rq_with(setup, "-v", *args, "--json", env=env))
    assert rc == ExitCode.UNREACHABLE, err
    assert "rq: info: transfer.quic: probe info 127.0.0.1" in err.splitlines(), err
    assert "probe debug" not in err and "other library" not in err, err  # -v: rq's INFO only
    assert all(json.loads(line) for line in out.splitlines()), out  # stdout: the JSON alone
    rc, _, err = _communicate(popen_rq_with(setup, "-vv", *args, env=env))
    assert "rq: debug: transfer.quic: probe debug" in err.splitlines(), err
    assert "rq: info: botocore.hooks: other library" in err.splitlines(), err
    rc, _, err = _communicate(popen_rq_with(setup, *args, env=env))
    assert "probe" not in err, err  # nothing without -v


def test_the_show_logs_handler_is_one_line_and_undone_by_hide_logs() -> None:
    from rqcli.output import hide_logs, show_logs

    stderr = io.StringIO()
    show_logs(Output(stderr=stderr, stdout=io.StringIO(), verbose=1))
    try:
        try:
            raise OSError(105, "No buffer space available")
        except OSError as exc:
            logging.getLogger("transfer.quic").info("QUIC datagram dropped (1 so far): %s", exc, exc_info=exc)
    finally:
        hide_logs()
    logging.getLogger("transfer.quic").info("after")
    lines = stderr.getvalue().splitlines()
    assert lines == [
        "rq: info: transfer.quic: QUIC datagram dropped (1 so far): [Errno 105] No buffer space available"
    ]


# ------------------------------------------------------------------------------ 2: interrupted send


def test_an_interrupted_send_says_what_the_receiver_holds_and_to_re_run(
    tmp_path: Path, receivers: list[Recv]
) -> None:
    """`rq: stopped by SIGTERM` alone, though the summary said "resumable": true."""
    src = _file(tmp_path / "big.bin", 200)
    recv = Recv(tmp_path / "dest", tmp_path / "cert").start()
    receivers.append(recv)
    rc, _, stderr = interrupt_mid_send(
        recv, src, "--chunk-size", "1M", settle=0.05
    )  # (its ACKs reach the sender)
    err = stderr.decode()
    assert rc == ExitCode.INTERRUPTED, err
    last = err.splitlines()[-1]
    assert last.startswith("rq: stopped by SIGTERM; the receiver confirmed "), err
    assert " of the transfer's 200 chunk(s) verified: re-run the same command to resume" in last, err


# --------------------------------------------------------------- 3: resumed / already complete send


def test_a_resumed_send_says_what_was_already_there_and_a_finished_one_says_so(
    tmp_path: Path, receivers: list[Recv]
) -> None:
    src = _file(tmp_path / "ckpt.bin", 8)
    recv = Recv(tmp_path / "dest", tmp_path / "cert", "tcp", "--once").start()
    receivers.append(recv)
    env = rq_env()
    res = send([src], recv, "--chunk-size", "1M", env=env)
    assert res.returncode == 0, res.stderr
    first = summary(res)
    assert first["resumed_bytes"] == 0 and first["already_complete"] is False, first
    # the receiver committed it; a re-run of the same command finds it complete there
    recv2 = Recv(tmp_path / "dest", tmp_path / "cert", "tcp", "--once").start()
    receivers.append(recv2)
    res = subprocess.run(
        rq_cmd("send", str(src), recv2.url, *recv2.send_args(), "--chunk-size", "1M"),
        env=env, capture_output=True, timeout=60, cwd=REPO, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert b"already complete on the receiver (an earlier run finished it); nothing moved" in res.stdout
    recv3 = Recv(tmp_path / "dest", tmp_path / "cert", "tcp", "--once").start()
    receivers.append(recv3)
    again = summary(send([src], recv3, "--chunk-size", "1M", env=env))
    assert again["already_complete"] is True and again["resumed_bytes"] == 8 << 20, again


def test_a_resumed_send_names_the_bytes_already_on_the_receiver(
    tmp_path: Path, receivers: list[Recv]
) -> None:
    src = _file(tmp_path / "ckpt.bin", 64)
    recv = Recv(tmp_path / "dest", tmp_path / "cert", "tcp").start()
    receivers.append(recv)
    interrupt_mid_send(recv, src, "--chunk-size", "1M")
    res = subprocess.run(
        rq_cmd("send", str(src), recv.url, *recv.send_args(), "--chunk-size", "1M"),
        env=rq_env(), capture_output=True, timeout=60, cwd=REPO, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    line = res.stdout.decode()
    assert "bytes already on the receiver (resumed), " in line, line
    got = int(line.split(" bytes already on the receiver")[0].rsplit(" ", 1)[1])
    assert 0 < got < 64 << 20, line


# ------------------------------------------------------------------------- 4: source changed since


def test_files_restarted_for_a_changed_source_are_named_on_both_sides(
    tmp_path: Path, receivers: list[Recv]
) -> None:
    """The receiver said 'restarting 1 file(s)' without the name; the sender nothing at all."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    big = _file(ckpt / "shard-0.bin", 64)
    recv = Recv(tmp_path / "dest", tmp_path / "cert", "tcp").start()
    receivers.append(recv)
    interrupt_mid_send(recv, ckpt, "--chunk-size", "1M")
    _file(big, 64)  # the trainer wrote a new shard meanwhile
    res = send([ckpt], recv, "--chunk-size", "1M")
    assert res.returncode == 0, res.stderr
    done = summary(res)
    assert done["restarted"] == ["ckpt/shard-0.bin"] and done["restarted_count"] == 1, done
    assert b"sending these again whole: ckpt/shard-0.bin" in res.stderr, res.stderr
    _, _, err = recv.stop()
    assert "restarting 1 file(s): ckpt/shard-0.bin" in err, err


def test_a_long_list_of_names_is_cut_to_five_and_a_count() -> None:
    from rqcli.commands.transfer import _some_names

    names = [f"d/f{i}" for i in range(8)]
    assert _some_names(names, 8) == "d/f0, d/f1, d/f2, d/f3, d/f4 and 3 more"
    assert _some_names(names[:2], 2) == "d/f0, d/f1"


# ------------------------------------------------------------------------------- 5: full disk


def test_a_full_receiver_disk_is_said_once_without_the_max_bytes_hint(
    tmp_path: Path, receivers: list[Recv]
) -> None:
    """A 150 MB file into a 100 MB tmpfs over QUIC (two streams): the receiver said `refused` and
    its warning twice, and the sender's hint said --max-bytes, which was not what refused it."""
    src = tmp_path / "big.bin"
    with open(src, "wb") as fh:
        fh.write(os.urandom(150_000_000))
    with own_tmpfs(tmp_path / "small", "size=100m") as dest:
        recv = Recv(dest, tmp_path / "cert", "quic").start()
        receivers.append(recv)
        res = subprocess.run(
            rq_cmd("send", str(src), recv.url, *recv.send_args()),
            env=rq_env(), capture_output=True, timeout=120, cwd=REPO, check=False,
        )  # fmt: skip
        _, out, err = recv.stop()
    assert res.returncode == ExitCode.NO_SPACE, res.stderr
    said = res.stderr.decode()
    assert "--max-bytes" not in said and "free space on the receiver" in said, said
    assert "bytes of this transfer still to write" in said, said
    refused = [json.loads(x) for x in out.splitlines() if '"refused"' in x]
    assert len(refused) == 1, out
    warned = [x for x in err.splitlines() if "refused a transfer" in x]
    assert len(warned) == 1 and f"(DEST {dest})" in warned[0], err


# ------------------------------------------------------------------------------- 6: heartbeat


SLOW = "import rqcli.output as o\no.HEARTBEAT_EVERY = 0.05\n"


def test_off_a_terminal_a_send_writes_a_heartbeat_line(tmp_path: Path, receivers: list[Recv]) -> None:
    """Output.progress() gave None off a terminal: a CI log showed nothing until the end."""
    src = _file(tmp_path / "big.bin", 128)
    recv = Recv(tmp_path / "dest", tmp_path / "cert", "tcp").start()
    receivers.append(recv)
    args = ("send", str(src), recv.url, *recv.send_args(), "--chunk-size", "64K", "--compress", "zstd")
    rc, out, err = _communicate(popen_rq_with(SLOW, *args, env=rq_env()))
    assert rc == 0, err
    beats = [x for x in err.splitlines() if x.startswith("rq: sending: ")]
    assert beats, err
    assert all(" of 128.0 MiB (" in x for x in beats), beats
    assert any(x.endswith(" s left") and " MB/s, ~" in x for x in beats), beats
    # --json: stdout stays the JSON stream and stderr gets no heartbeat; -q: none either
    for extra in ("--json", "-q"):
        rc, out, err = _communicate(popen_rq_with(SLOW, *args, extra, env=rq_env()))
        assert rc == 0 and "rq: sending" not in err, err
        if extra == "--json":
            assert all(json.loads(x) for x in out.splitlines())


def test_the_heartbeat_says_nothing_before_its_interval_and_says_a_stall(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import rqcli.output as output
    from rqcli.output import Heartbeat

    stderr = io.StringIO()
    beat = Heartbeat(Output(stderr=stderr, stdout=io.StringIO()), transfer=False)
    task = beat.add_task("replay", total=1000)
    beat.update(task, completed=100)
    beat.stop()
    assert stderr.getvalue() == ""  # a run shorter than HEARTBEAT_EVERY: nothing
    monkeypatch.setattr(output, "HEARTBEAT_EVERY", 0.0)
    beat = Heartbeat(Output(stderr=stderr, stdout=io.StringIO()), transfer=False)
    task = beat.add_task("replay", total=1000)
    beat.stop()
    beat._last -= 1.0
    beat.update(task, completed=250)
    (line,) = beat.lines()
    assert line.startswith("replay: 250 of 1000 (25%), ") and line.endswith(" s left"), line
    beat._tasks[task].moved_at -= 30
    (line,) = beat.lines()
    assert line == "replay: 250 of 1000 (25%), no progress for 30 s", line
    assert beat.lines() == []  # said again only once it has been still twice as long
