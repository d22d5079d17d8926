"""From a review of send/recv under adversity and as CI scripts drive them (2026-11-23): what a
blank secret, an empty SOURCE, a token path with a space, nan seconds, kill -9 of a multi-process
sender and a dead --workers receiver process used to do."""

from __future__ import annotations

import os
import select
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest
from xfer_kit import REPO, Recv, rq_cmd, rq_env, send, summary, wait_for

from rqcli.exitcodes import ExitCode


def _run(
    *args: str, env: dict[str, str] | None = None, cwd: Path = REPO
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        rq_cmd(*args), env=env or rq_env(), capture_output=True, timeout=60, cwd=cwd, check=False
    )


@pytest.mark.parametrize("blank", [" ", "\n", "\t \n"])
def test_a_blank_rq_token_is_refused_on_both_sides(tmp_path: Path, blank: str) -> None:
    """It became an empty secret that any sender knows: the receiver let everyone in."""
    env = rq_env(token=blank)
    res = _run(
        "recv", str(tmp_path / "d"), "--listen", "127.0.0.1:0", "--transport", "tcp", "--once", env=env
    )
    assert res.returncode == ExitCode.AUTH and b"RQ_TOKEN is blank" in res.stderr, res.stderr
    (tmp_path / "f").write_bytes(b"x")
    res = _run("send", str(tmp_path / "f"), "rq://127.0.0.1:9", "--transport", "tcp", env=env)
    assert res.returncode == ExitCode.AUTH and b"RQ_TOKEN is blank" in res.stderr, res.stderr
    assert not (tmp_path / "d").exists()


def test_an_empty_source_is_a_usage_error_not_the_working_directory(tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_bytes(b"not for sending")
    res = _run("send", "", "rq://127.0.0.1:9", "--transport", "tcp", cwd=tmp_path)
    assert res.returncode == ExitCode.USAGE and b"empty string" in res.stderr, res.stderr


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_seconds_that_never_end_are_refused(tmp_path: Path, value: str) -> None:
    (tmp_path / "f").write_bytes(b"x")
    for flag in ("--retry-for", "--timeout"):
        res = _run("send", str(tmp_path / "f"), "rq://127.0.0.1:9", "--transport", "tcp", flag, value)
        assert res.returncode == ExitCode.USAGE, (flag, res.stderr)  # nan retried for ever before


def test_the_pasteable_line_quotes_a_token_file_with_a_space(tmp_path: Path) -> None:
    token_file = tmp_path / "my tok"
    token_file.write_text("a-token-for-this-test\n")
    token_file.chmod(0o600)  # a token file others can read is refused (test_sec_private_files.py)
    recv = Recv(tmp_path / "d", tmp_path / "cert", "tcp", "--once", "--token-file", str(token_file)).start()
    try:
        line = recv.info["send"]
        argv = shlex.split(line.replace("SOURCE", shlex.quote(str(tmp_path / "f"))))
        (tmp_path / "f").write_bytes(b"pasted")
        env = {k: v for k, v in rq_env().items() if k != "RQ_TOKEN"}
        res = subprocess.run(
            rq_cmd(*argv[1:]), env=env, capture_output=True, timeout=60, cwd=REPO, check=False
        )
        assert res.returncode == 0, (line, res.stderr)
    finally:
        recv.stop()
    assert (tmp_path / "d" / "f").read_bytes() == b"pasted"


def _children(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(entry))
    return kids


def _stderr_until(proc: subprocess.Popen[bytes], word: str, timeout: float) -> str:
    """What `proc` wrote to stderr until a line with `word` (or its exit, or `timeout` s)."""
    assert proc.stderr is not None
    fd, got = proc.stderr.fileno(), b""
    end = time.monotonic() + timeout
    while word.encode() not in got and time.monotonic() < end:
        ready, _, _ = select.select([fd], [], [], max(0.0, end - time.monotonic()))
        if not ready:
            break
        data = os.read(fd, 65536)
        if not data:
            break
        got += data
    return got.decode(errors="replace")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_kill_9_of_a_multi_process_sender_takes_its_connection_processes_with_it(tmp_path: Path) -> None:
    """They went on sending on their own, then hung for ever on a queue nobody read."""
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(64 << 20))
    recv = Recv(tmp_path / "d", tmp_path / "cert", "quic").start()
    proc = subprocess.Popen(
        rq_cmd("send", str(src), recv.url, *recv.send_args(), "--connections", "2", "--chunk-size", "64KiB"),
        env=rq_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=REPO,
    )
    try:
        assert wait_for(lambda: len(_children(proc.pid)) >= 2, 30, step=0.02)
        kids = _children(proc.pid)
        proc.kill()
        proc.wait(timeout=10)
        assert wait_for(lambda: not any(_alive(k) for k in kids), 15), [k for k in kids if _alive(k)]
    finally:
        for k in _children(proc.pid):
            os.kill(k, signal.SIGKILL)
        recv.stop()


def test_a_dead_workers_process_is_no_longer_offered_to_senders(tmp_path: Path) -> None:
    """Senders kept retrying its port on every transfer (attempts 5, ten times slower), and the
    receiver said nothing."""
    recv = Recv(tmp_path / "d", tmp_path / "cert", "quic", "--workers", "2").start()
    told = ""
    try:
        assert recv.proc is not None
        assert wait_for(lambda: len(_children(recv.proc.pid)) >= 1, 30)  # type: ignore[union-attr]
        worker = max(_children(recv.proc.pid))
        os.kill(worker, signal.SIGKILL)
        # the receiver looks at its workers twice a second: send once it has said it saw this one
        # die (it drops the port before it says so), not after a fixed pause a slow machine outruns
        told = _stderr_until(recv.proc, "died", 30)
        assert "died" in told, told
        src = tmp_path / "f.bin"
        src.write_bytes(os.urandom(4 << 20))
        # 4 chunks: two connections, the second one to the data port of the process killed (one
        # chunk went over one connection, to the main port, and never asked for that port at all)
        res = send([src], recv, "--connections", "2", "--chunk-size", "1MiB", "--retry-for", "5")
        assert res.returncode == 0, res.stderr
        assert summary(res)["attempts"] == 1 and b"cannot reach" not in res.stderr, res.stderr
    finally:
        _, _, rest = recv.stop()
    err = told + rest
    assert "receiver process (data port" in err and "died" in err, err


def test_a_pin_on_plain_tcp_is_a_usage_error_not_silently_ignored(tmp_path: Path) -> None:
    """A script that passes a pin believes the certificate is checked; plain TCP has none."""
    (tmp_path / "f").write_bytes(b"x")
    for where in (["rq://127.0.0.1:9?pin=sha256:zz"], ["rq://127.0.0.1:9", "--pin", "sha256:" + "ab" * 32]):
        res = _run("send", str(tmp_path / "f"), *where, "--transport", "tcp")
        assert res.returncode == ExitCode.USAGE and b"add --tls" in res.stderr, res.stderr
