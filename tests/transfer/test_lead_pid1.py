"""rq as PID 1, the way a container runs it (`docker run` with rq as the entrypoint, no --init or
tini): `unshare -fp --mount-proc` makes rq the first process of a new PID namespace.

Its child processes' parent pid really is 1 there, and they used to take that for "the rq that
started me is gone": `rq send --connections 2` acked 8 of its 15 chunks and then waited for ever
(its child returned at once, exit 0, which the parent did not count as a failure), and
`rq recv --workers 2` exited 1 at start ("the rq recv that started this worker is gone").
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from xfer_kit import REPO, Recv, journal_records, rq_cmd, rq_env, tree_digest, wait_for

pytestmark = pytest.mark.integration

CHUNK = "512KiB"  # 3 files of 2 MiB: 12 chunks, shared by 2 connections
BOUND_S = 20.0
SLOW = (
    "--quic-backend",
    "aioquic",
    "--datagram-size",
    "1400",
)  # slow enough to stop mid-transfer  # the old code never ended: each run is given up (and failed) after this


def _pid_namespaces() -> str | None:
    """Why a PID namespace cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root for unshare(1) --pid"
    if shutil.which("unshare") is None:
        return "needs unshare(1)"
    probe = subprocess.run(
        ["unshare", "-fp", "--mount-proc", "true"], capture_output=True, timeout=10, check=False
    )
    if probe.returncode != 0:
        return f"unshare -fp --mount-proc fails here: {probe.stderr.decode().strip()}"
    return None


_WHY_NOT = _pid_namespaces()
needs_pidns = pytest.mark.skipif(_WHY_NOT is not None, reason=_WHY_NOT or "")
# --kill-child: a hung rq dies with unshare when the test gives up on it
AS_PID1 = ["unshare", "-fp", "--mount-proc", "--kill-child"]


def _source(tmp_path: Path, size: int = 2 << 20) -> Path:
    src = tmp_path / "ckpt"
    src.mkdir()
    for i in range(3):
        (src / f"f{i}.bin").write_bytes(os.urandom(size))
    return src


def _run(cmd: list[str], env: dict[str, str] | None = None) -> tuple[int, str, str, float]:
    """Runs `cmd`, failing the test (not hanging it) when it is still running after BOUND_S."""
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd, env=env or rq_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        out, err = proc.communicate(timeout=BOUND_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"still running after {BOUND_S:.0f} s: {out.decode()[-400:]} {err.decode()[-400:]}")
    return proc.returncode, out.decode(), err.decode(), time.monotonic() - started


def _summary(out: str) -> dict[str, object]:
    lines = [json.loads(x) for x in out.splitlines() if x.strip()]
    found = [x for x in lines if x.get("event") == "summary"]
    assert found, out
    return found[-1]


def _rq_in(unshare_pid: int) -> int:
    """The pid (here) of rq, the one child of `unshare -f`: PID 1 of its namespace."""
    path = Path(f"/proc/{unshare_pid}/task/{unshare_pid}/children")
    assert wait_for(lambda: path.read_text().split() != [], 10)
    (pid,) = path.read_text().split()
    return int(pid)


def _zombies_under(pid: int) -> list[int]:
    """The children of `pid` that exited and were not reaped."""
    kids = [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    return [k for k in kids if Path(f"/proc/{k}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"]


@needs_pidns
def test_send_with_connections_as_pid1_completes(tmp_path: Path) -> None:
    src = _source(tmp_path)
    recv = Recv(tmp_path / "dst", tmp_path / "cert", "quic", "--workers", "2", "--once").start()
    try:
        args = ["send", str(src), recv.url, *recv.send_args(), "--json", "--connections", "2"]
        rc, out, err, _ = _run([*AS_PID1, *rq_cmd(*args, "--chunk-size", CHUNK, "--retry-for", "5")])
        assert rc == 0, err
        summary = _summary(out)
        assert summary["complete"] and summary["chunks_acked"] == 12, summary
        assert recv.wait(10)[0] == 0
    finally:
        recv.stop()
    assert tree_digest(tmp_path / "dst" / "ckpt") == tree_digest(src)


@needs_pidns
def test_recv_workers_as_pid1_receives_and_stops_on_sigterm(tmp_path: Path) -> None:
    src = _source(tmp_path)
    dest = tmp_path / "dst"
    # before: exit 1 at start, "the rq recv that started this worker is gone" (Recv.start fails)
    recv = Recv(dest, tmp_path / "cert", "quic", "--workers", "2", wrap=AS_PID1).start()
    try:
        assert recv.proc is not None
        rq = _rq_in(recv.proc.pid)
        args = ["send", str(src), recv.url, *recv.send_args(), "--json", "--connections", "2"]
        rc, out, err, _ = _run(rq_cmd(*args, "--chunk-size", CHUNK))
        assert rc == 0, err
        assert _summary(out)["complete"]
        assert tree_digest(dest / "ckpt") == tree_digest(src)
        assert _zombies_under(rq) == []
        # `docker stop`: SIGTERM to the container's PID 1 from outside; a receiver stops, exit 0
        started = time.monotonic()
        os.kill(rq, signal.SIGTERM)
        code, _, err = recv.wait(15)
        assert code == 0, err
        assert time.monotonic() - started < 10
        assert "gone" not in err and "failed to start" not in err
    finally:
        recv.stop()


@needs_pidns
def test_send_as_pid1_stops_on_sigterm(tmp_path: Path) -> None:
    """The sender, PID 1 of its namespace, mid-transfer with its connection process, to a receiver
    that stopped answering (SIGSTOP), is sent SIGTERM from outside (`docker stop`): it stops as
    documented, exit 130 and a summary, its connection process told to stop and reaped."""
    src = _source(tmp_path, 8 << 20)
    recv = Recv(tmp_path / "dst", tmp_path / "cert", "quic", *SLOW, "--workers", "2").start()
    assert recv.proc is not None
    workers = Path(f"/proc/{recv.proc.pid}/task/{recv.proc.pid}/children").read_text().split()
    frozen = [recv.proc.pid, *map(int, workers)]
    args = ["send", str(src), recv.url, *recv.send_args(), "--json", "--connections", "2", *SLOW]
    sender = subprocess.Popen(
        [*AS_PID1, *rq_cmd(*args, "--chunk-size", CHUNK, "--retry-for", "60")],
        env=rq_env(),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        rq = _rq_in(sender.pid)
        # its connection process (and multiprocessing's resource tracker) started, and chunks
        # landed: freeze the receiver
        assert wait_for(lambda: len(Path(f"/proc/{rq}/task/{rq}/children").read_text().split()) >= 2, 10)
        assert wait_for(lambda: journal_records(tmp_path / "dst") >= 2, 10)
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        time.sleep(0.5)
        assert _zombies_under(rq) == []
        started = time.monotonic()
        os.kill(rq, signal.SIGTERM)
        out, err = sender.communicate(timeout=15)
        took = time.monotonic() - started
    finally:
        if sender.poll() is None:
            sender.kill()
            sender.wait()
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
        recv.stop()
    assert sender.returncode == 130, err.decode()
    summary = _summary(out.decode())
    assert summary["error"] == "stopped by SIGTERM" and not summary["complete"], summary
    assert summary["chunks_sent"], summary  # stopped mid-transfer (its acks may still be in flight)
    assert took < 8, took  # its connection process gets STOP_S (2 s) to finish its chunk, then is killed


SITECUSTOMIZE = """
import sys
if "--multiprocessing-fork" in sys.orig_argv:
    import transfer.procs
    transfer.procs.die_with_parent = lambda parent: False  # the child returns at once, exit 0
"""


def test_a_connection_process_that_exits_0_without_its_share_is_a_failure(tmp_path: Path) -> None:
    """Whatever makes a connection process end early without an error (here: it believes its
    parent gone), the send must not wait for its chunks for ever: the attempt counts as a lost
    connection and is retried. Connection 0 (in the sender itself) moves its half each time, so the
    retries converge (12, 6, 3, then 1 chunk: one connection, no child) and the send completes."""
    src = _source(tmp_path)
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = rq_env(PYTHONPATH=os.pathsep.join([str(site), str(REPO)]))
    recv = Recv(tmp_path / "dst", tmp_path / "cert", "quic", "--workers", "2").start()
    try:
        args = ["send", str(src), recv.url, *recv.send_args(), "--json", "--connections", "2"]
        rc, out, err, took = _run(rq_cmd(*args, "--chunk-size", CHUNK, "--retry-for", "2"), env=env)
    finally:
        recv.stop()
    assert rc == 0, err
    summary = _summary(out)
    assert summary["complete"] and summary["attempts"] >= 2, summary
    retries = [json.loads(x) for x in out.splitlines() if '"retry"' in x]
    assert retries and all("without finishing its share" in r["error"] for r in retries), out
    assert took < BOUND_S
