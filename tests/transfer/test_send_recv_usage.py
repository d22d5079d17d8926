"""`rq send` / `rq recv` against their documented usage contract (docs-against-behaviour review,
third round): an empty DEST, sizes read as every rq command reads them, a summary as the last
--json line for every refused argument and for a signal while rq starts, exit 2 for a DEST or a
--listen address that cannot be used, and no flag of another transport taken in silence."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from xfer_kit import REPO, Recv, rq_cmd, rq_env, send, summary

from rqcli.exitcodes import ExitCode

URL = "rq://127.0.0.1:9"


def _rq(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        rq_cmd(*args), env=env or rq_env(), capture_output=True, timeout=60, cwd=cwd or REPO, check=False
    )


def _last_json(proc: subprocess.CompletedProcess[bytes]) -> dict[str, object]:
    lines = proc.stdout.decode().splitlines()
    assert lines, f"no stdout: rc={proc.returncode} stderr={proc.stderr.decode()}"
    last = json.loads(lines[-1])
    assert isinstance(last, dict)
    return last


def _one_error_line(proc: subprocess.CompletedProcess[bytes]) -> str:
    err = proc.stderr.decode()
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


# -- 1. an empty DEST ------------------------------------------------------------------------------


def test_recv_refuses_an_empty_dest_as_send_refuses_an_empty_source(tmp_path: Path) -> None:
    """Was: `rq recv ''` served into the working directory (./.rq-partial made there)."""
    proc = _rq("recv", "", "--transport", "tcp", "--listen", "127.0.0.1:0", "--once", cwd=tmp_path)
    assert proc.returncode == ExitCode.USAGE, proc.stderr
    assert "DEST_DIR is an empty string (an unset variable?)" in _one_error_line(proc)
    assert list(tmp_path.iterdir()) == []


def test_send_refuses_a_file_named_with_a_trailing_slash(tmp_path: Path) -> None:
    """Was: `rq send model.bin/ …` sent model.bin, exit 0 (Path drops the slash); cp, rsync and
    rq preload refuse FILE/. A directory (and a link to one) with the slash is still sent."""
    (tmp_path / "model.bin").write_bytes(b"x")
    proc = _rq("send", "model.bin/", URL, "--transport", "tcp", cwd=tmp_path)
    assert proc.returncode == ExitCode.NOT_FOUND, proc.stderr
    assert "source model.bin/ is a file, not a directory (drop the trailing /)" in _one_error_line(proc)
    (tmp_path / "d").mkdir()
    (tmp_path / "ld").symlink_to("d")
    for ok in ("d/", "ld/"):  # past the check: the closed port 9 ends it (exit 6, unreachable)
        proc = _rq("send", ok, URL, "--transport", "tcp", "--timeout", "2", cwd=tmp_path)
        assert proc.returncode == ExitCode.UNREACHABLE, proc.stderr


# -- 2. sizes --------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", ["1.5", "0.5", "4096.25"])
def test_recv_max_bytes_without_a_unit_must_be_whole(tmp_path: Path, size: str) -> None:
    """Was: `--max-bytes 1.5` taken as 1 byte (int(float(…)))."""
    proc = _rq(
        "recv", str(tmp_path / "d"), "--transport", "tcp", "--listen", "127.0.0.1:0", "--max-bytes", size
    )
    assert proc.returncode == ExitCode.USAGE, proc.stderr
    assert "--max-bytes" in _one_error_line(proc) and "whole number of bytes" in proc.stderr.decode()


def test_send_chunk_size_without_a_unit_must_be_whole_and_keeps_its_limits(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x")
    fraction = _rq(
        "send", str(tmp_path / "f"), URL, "--transport", "tcp", "--json", "--chunk-size", "65536.5"
    )
    assert fraction.returncode == ExitCode.USAGE and "whole number of bytes" in _one_error_line(fraction)
    assert _last_json(fraction)["transfer_id"] is None  # the old parser took 65536 and went on
    small = _rq("send", str(tmp_path / "f"), URL, "--transport", "tcp", "--json", "--chunk-size", "1K")
    assert small.returncode == ExitCode.USAGE and "--chunk-size must be between" in _one_error_line(small)


def test_a_fraction_with_a_unit_is_whole_bytes_on_the_receiver(tmp_path: Path) -> None:
    """`--max-bytes 1.5K` is 1536 bytes, as `--ram-limit 1.5K` is (cache.sizes)."""
    recv = Recv(tmp_path / "d", tmp_path / "cert", "tcp", "--max-bytes", "1.5K").start()
    try:
        (tmp_path / "fits").write_bytes(b"a" * 1536)
        (tmp_path / "over").write_bytes(b"b" * 1537)
        assert send([tmp_path / "fits"], recv).returncode == 0
        over = send([tmp_path / "over"], recv)
        assert over.returncode == ExitCode.NO_SPACE, over.stderr
        assert summary(over)["complete"] is False
    finally:
        recv.stop()


# -- 3. a summary for every refused argument -------------------------------------------------------


@pytest.mark.parametrize(
    "extra",
    [
        ["--connections", "0"],
        ["--chunk-size", "10s"],
        ["--streams", "99"],
        ["--retry-for", "-1"],
        ["--timeout", "nan"],
        ["--transport", "foo"],
        ["--compress", "lz4"],
        ["--no-such-flag"],
        ["--chunk-size"],  # a value missing: Click's parser, before any option is read
    ],
)
@pytest.mark.parametrize("where", ["after", "before"])
def test_send_json_ends_with_a_summary_when_click_refuses_an_argument(
    tmp_path: Path, extra: list[str], where: str
) -> None:
    """Was: exit 2 and an empty stdout, where docs/cli.md promises the summary for a bad argument."""
    (tmp_path / "f").write_bytes(b"x")
    args = ["send", str(tmp_path / "f"), URL, *extra]
    args = [*args, "--json"] if where == "after" else ["--json", *args]
    proc = _rq(*args)
    assert proc.returncode == ExitCode.USAGE, proc.stderr
    err = _one_error_line(proc)
    last = _last_json(proc)
    assert last["event"] == "summary" and last["transfer_id"] is None and last["complete"] is False, last
    assert last["bytes_raw"] == 0 and last["error"] and str(last["error"]) in err, (last, err)
    assert len(proc.stdout.decode().splitlines()) == 1


def test_the_summary_comes_from_rq_send_json_in_the_environment_too(tmp_path: Path) -> None:
    proc = _rq("send", "x", URL, "--no-such-flag", env=rq_env(RQ_SEND_JSON="1"))
    assert proc.returncode == ExitCode.USAGE and _last_json(proc)["event"] == "summary"


def test_no_summary_without_json(tmp_path: Path) -> None:
    proc = _rq("send", "x", URL, "--connections", "0")
    assert proc.returncode == ExitCode.USAGE and proc.stdout == b""


# -- 4. a signal while rq starts -------------------------------------------------------------------

# Runs the console entry as `rq send --json …`, with a signal sent to itself when the named module
# is first imported: a deterministic "signal in the first ~150 ms", the window where rq died of
# SIGTERM without a word and printed a traceback for SIGINT.
_SIGNAL_AT_IMPORT = textwrap.dedent(
    """
    import importlib.abc, os, sys
    module, signum = sys.argv[1], int(sys.argv[2])

    class Trip(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == module:
                sys.meta_path.remove(self)
                os.kill(os.getpid(), signum)
            return None

    sys.meta_path.insert(0, Trip())
    sys.argv = ["rq", *sys.argv[3:]]
    from rqcli.console import main
    main()
    """
)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize(
    "module",
    [
        "click",  # rq's own imports, before main() ran
        "rqcli.commands.transfer",  # the command's module, loaded by the group
        "transfer.credentials",  # the send command's first lazy import
    ],
)
def test_a_signal_while_rq_send_starts_still_ends_json_with_a_summary(
    tmp_path: Path, sig: signal.Signals, module: str
) -> None:
    (tmp_path / "f").write_bytes(b"x")
    send_args = ["send", str(tmp_path / "f"), URL, "--transport", "tcp", "--json"]
    proc = subprocess.run(
        [sys.executable, "-c", _SIGNAL_AT_IMPORT, module, str(int(sig)), *send_args],
        env=rq_env(),
        capture_output=True,
        timeout=60,
        cwd=REPO,
        check=False,
    )
    why = "interrupted" if sig == signal.SIGINT else "stopped by SIGTERM"
    assert proc.returncode == ExitCode.INTERRUPTED, proc.stderr
    assert proc.stderr.decode().strip().splitlines()[-1] == f"rq: {why}", proc.stderr
    assert b"Traceback" not in proc.stderr
    last = _last_json(proc)
    assert last["event"] == "summary" and last["transfer_id"] is None and last["error"] == why, last
    assert len(proc.stdout.decode().splitlines()) == 1


# -- 5. exit codes of a DEST or --listen that cannot be used ---------------------------------------


@pytest.mark.parametrize("dest", ["file", "file/sub"])
def test_a_dest_that_cannot_be_a_directory_is_a_usage_error(tmp_path: Path, dest: str) -> None:
    """As `rq preload --cache-dir FILE` and `--topics-dir FILE`; `file/sub` was exit 1."""
    (tmp_path / "file").write_bytes(b"x")
    proc = _rq("recv", str(tmp_path / dest), "--transport", "tcp", "--listen", "127.0.0.1:0")
    assert proc.returncode == ExitCode.USAGE, proc.stderr
    assert "file" in _one_error_line(proc)


def _taken_port(kind: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, kind)
    s.bind(("127.0.0.1", 0))
    if kind == socket.SOCK_STREAM:
        s.listen()
    return s


@pytest.mark.parametrize("transport", ["tcp", "quic"])
@pytest.mark.parametrize("listen", ["no-such-host.invalid:7420", "192.0.2.1:7420", "taken"])
def test_a_listen_address_that_cannot_be_bound_is_a_usage_error(
    tmp_path: Path, transport: str, listen: str
) -> None:
    """Was exit 6, "unreachable": no peer was involved, the address is the user's to change."""
    kind = socket.SOCK_STREAM if transport == "tcp" else socket.SOCK_DGRAM
    with _taken_port(kind) as taken:
        if listen == "taken":
            listen = f"127.0.0.1:{taken.getsockname()[1]}"
        proc = _rq(
            "recv", str(tmp_path / "d"), "--transport", transport, "--listen", listen,
            "--cert-dir", str(tmp_path / "cert"),
        )  # fmt: skip
    assert proc.returncode == ExitCode.USAGE, proc.stderr
    assert f"cannot listen on {listen}" in _one_error_line(proc)


# -- 6. flags of another transport -----------------------------------------------------------------


@pytest.mark.parametrize(
    "transport,flags",
    [
        ("quic", ["--tls"]),
        ("quic", ["--no-tls"]),
        ("tcp", ["--datagram-size", "1500"]),
        ("tcp", ["--quic-backend", "aioquic"]),
        ("quic", ["--rdma-device", "mlx5_0"]),
        ("tcp", ["--gid-index", "1"]),
        ("recv-only", ["--workers", "2"]),
    ],
)
@pytest.mark.parametrize("command", ["send", "recv"])
def test_a_flag_of_another_transport_is_refused(
    tmp_path: Path, command: str, transport: str, flags: list[str]
) -> None:
    """Were exit 0, the flag ignored without a word."""
    if transport == "recv-only":
        if command == "send":
            pytest.skip("--workers is rq recv's")
        transport = "tcp"
    (tmp_path / "f").write_bytes(b"x")
    where = (
        [str(tmp_path / "f"), URL, "--json"]
        if command == "send"
        else [str(tmp_path / "d"), "--once", "--listen", "127.0.0.1:0", "--cert-dir", str(tmp_path / "c")]
    )
    proc = _rq(command, *where, "--transport", transport, *flags)
    assert proc.returncode == ExitCode.USAGE, proc.stderr
    err = _one_error_line(proc)
    assert f"with --transport {transport} it would be ignored" in err, err
    if command == "send":
        assert _last_json(proc)["error"] in err


def test_settings_from_the_environment_for_another_transport_are_not_refused(tmp_path: Path) -> None:
    """RQ_* and the config file hold settings for whichever transport runs."""
    env = rq_env(RQ_RECV_QUIC_BACKEND="aioquic", RQ_RECV_WORKERS="2")
    recv = Recv(tmp_path / "d", tmp_path / "cert", "tcp", env=env).start()
    try:
        (tmp_path / "f").write_bytes(b"x")
        ok = send([tmp_path / "f"], recv, env=rq_env(RQ_SEND_DATAGRAM_SIZE="1500"))
        assert ok.returncode == 0, ok.stderr
    finally:
        recv.stop()


def test_workers_1_with_tcp_is_what_tcp_does(tmp_path: Path) -> None:
    recv = Recv(tmp_path / "d", tmp_path / "cert", "tcp", "--workers", "1").start()
    assert recv.stop()[0] == 0


# -- 7. the human line brackets an IPv6 address ----------------------------------------------------


def test_recv_shows_an_ipv6_listen_address_in_brackets(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        rq_cmd("recv", str(tmp_path / "d"), "--transport", "tcp", "--listen", "[::1]:0"),
        env=rq_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
    finally:
        proc.terminate()
        proc.communicate(timeout=10)
    assert " on [::1]:" in line, line  # was ` on ::1:PORT`


@pytest.mark.parametrize("transport", ["tcp", "quic"])
def test_send_names_an_ipv6_receiver_in_brackets(tmp_path: Path, transport: str) -> None:
    """Was: 'cannot reach ::1:PORT over TCP' (the address and port run together)."""
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
            port = s.getsockname()[1]  # closed once the test sends: nothing listens there
    except OSError:
        pytest.skip("no IPv6 loopback on this machine")
    (tmp_path / "f").write_bytes(b"x")
    extra = ("--pin", "sha256:" + "0" * 64) if transport == "quic" else ()
    proc = _rq(
        "send", "f", f"rq://[::1]:{port}", "--transport", transport, "--timeout", "1", *extra, cwd=tmp_path
    )
    assert proc.returncode == ExitCode.UNREACHABLE, proc.stderr
    err = proc.stderr.decode()
    assert (
        "Traceback" not in err
        and f"rq: error: gave up after 1s without progress: cannot reach [::1]:{port} over" in err
    ), err
