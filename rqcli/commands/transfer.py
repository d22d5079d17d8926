"""`rq send` and `rq recv`: checkpoint transfer over QUIC, TCP or RDMA (library: transfer/)."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import parse_qs, urlsplit

import click
from platformdirs import user_config_path, user_data_path

from rqcli.errors import CliError, interruption, open_files_limit
from rqcli.exitcodes import ExitCode
from rqcli.output import Output, StdoutError, get_output, output_options, safe_text
from rqcli.params import (
    Age,
    CommandEnvFirst,
    NonEmptyPath,
    NonEmptyText,
    Seconds,
    Whole,
    documented_env_names,
)
from rqcli.versions import transfer_versions  # (rq --version reads it there too)

if TYPE_CHECKING:
    from collections.abc import Callable

    from transfer.codec import CompressMode


def _size_option(_ctx: click.Context, _param: click.Parameter, value: Any) -> int | None:
    """A size read as every rq command reads one (docs/cli.md "Sizes"): cache.sizes, not a parser of
    our own, which took `--max-bytes 1.5` for 1 byte."""
    from cache.errors import BadSourceError
    from cache.sizes import parse_size

    if value is None or isinstance(value, int):
        return value
    try:
        return parse_size(value)
    except BadSourceError as exc:
        raise click.BadParameter(str(exc)) from None


def _positive_size_option(ctx: click.Context, param: click.Parameter, value: Any) -> int | None:
    size = _size_option(ctx, param, value)
    if size is not None and size < 1:
        raise click.BadParameter(f"{value!r} must be at least 1 byte")
    return size


def _default_token_file() -> Path:
    return user_config_path("rq") / "transfer-token"


def _exit_code(exc: Exception) -> ExitCode:
    from transfer import errors as e

    table: list[tuple[type[Exception], ExitCode]] = [
        (e.AuthError, ExitCode.AUTH),
        (e.VerifyError, ExitCode.VERIFY),
        (e.NoSpaceError, ExitCode.NO_SPACE),
        (e.LimitError, ExitCode.NO_SPACE),
        (e.ExistsError, ExitCode.EXISTS),
        (e.UnsupportedError, ExitCode.UNSUPPORTED),
        (e.PeerUnreachableError, ExitCode.UNREACHABLE),
        (e.UnsafeNameError, ExitCode.FAILURE),
        (e.TlsMismatchError, ExitCode.USAGE),
    ]
    if isinstance(exc, e.SourceUnreadableError):  # as `rq preload` has them: 4 denied, 3 a FIFO
        return ExitCode.AUTH if exc.denied else ExitCode.NOT_FOUND
    for cls, code in table:
        if isinstance(exc, cls):
            return code
    return ExitCode.FAILURE


# QUIC needs datagrams of at least 1200 bytes (RFC 9000); qh3 takes up to 65000 and aioquic is
# clamped to 16383 by the driver (transfer/quic.py), whatever is asked for here.
DATAGRAM_RANGE = Whole(1200, 65000)

_HINTS = {
    ExitCode.AUTH: "check the token file / RQ_TOKEN and the --pin printed by `rq recv`",
    # exit 6 is a send that never got anything acknowledged (exit 8 is the resumable one): nothing
    # to resume, and the address is as likely at fault as the receiver
    # (rq send adds the transport it used: _unreachable_hint)
    ExitCode.UNREACHABLE: "is `rq recv` running there, at that address and port? then re-run the same command",
    # a real ENOSPC: freeing space is the cure (the receiver's --max-bytes cap refuses with a
    # LimitError, whose hint is _LIMIT_HINT)
    ExitCode.NO_SPACE: "free space on the receiver and re-run the same command to resume",
    ExitCode.EXISTS: "pass --overwrite to `rq recv` to replace existing files",
    ExitCode.VERIFY: "re-run the same command; changed or corrupt parts are sent again",
}


def _unreachable_hint(transport: str) -> str:
    """Exit 6's hint from `rq send`: a receiver on another transport (QUIC is UDP, TCP is TCP) looks
    exactly like none at all from here — the send spent its 10 s on retries and the hint never said
    --transport, though `rq recv`'s line to paste names it."""
    return (
        f"is `rq recv` running there, at that address and port, with --transport {transport} "
        "(the line `rq recv` printed names it)? then re-run the same command"
    )


_LIMIT_HINT = "the receiver's limits refuse it: raise --max-files / --max-bytes on `rq recv`"


def _cli_error(exc: Exception) -> CliError:
    from transfer.errors import (
        BusyError,
        DirectoryInTheWayError,
        LimitError,
        ResourceLimitError,
        SourceChangedError,
        UnresolvedError,
        UnsafeSecretError,
    )

    code = _exit_code(exc)
    hint = _LIMIT_HINT if isinstance(exc, LimitError) else _HINTS.get(code)
    if isinstance(exc, SourceChangedError | UnsafeSecretError):
        # not the token's fault, nor fixed by a re-run as such; an unsafe secret's line already
        # says its fix (chmod 600, a file of one's own): the token/--pin hint would mislead
        hint = None
    if isinstance(exc, DirectoryInTheWayError):
        # a directory where a file goes or a file where a directory goes: --overwrite replaces
        # files with files only (like cp), so its hint would not help here
        hint = "remove or rename it on the receiver, then re-run"
    if isinstance(exc, BusyError):
        hint = "one file is written by one transfer at a time: re-run when the other one has finished"
    if isinstance(exc, UnresolvedError):
        hint = "check the host name in rq://HOST:PORT, or give the receiver's IP address"
    if isinstance(exc, ResourceLimitError):
        hint = (
            f"the process ran out of open files (limit {open_files_limit()}): raise it (ulimit -n) or lower "
            "--connections, then re-run the same command to resume"
        )
    if code == ExitCode.NO_SPACE and "out of inodes" in str(exc):
        # neither freeing bytes nor --max-bytes helps a file system that has no inodes left
        hint = "free inodes on the receiver (df -i) and re-run the same command to resume"
    if code == ExitCode.NO_SPACE and "so none is kept" in str(exc) and hint:
        # nothing verified arrived before the disk filled (transfer.store.kept_text): a re-run
        # sends it all, and "to resume" promised what the receiver does not have
        hint = hint.removesuffix(" to resume")
    skew = _skew_hint(str(exc))
    if skew is not None:
        hint = skew
    return CliError(safe_text(str(exc)), code, hint=hint)


def _skew_hint(message: str) -> str | None:
    """The hint for two sides of different rq releases, naming what each speaks where the error
    tells (the token and pin are not at fault): None for any other error."""
    ours = f"this rq speaks {transfer_versions()}"
    same = "run the same rq release on both sides (`rq --version` shows these numbers)"
    m = re.search(r"unsupported protocol version (\S+?)[ ;(]", message + " ")
    if m is not None:
        return f"the manifest was version {m.group(1)}; {ours}: {same}"
    m = re.search(r"peer speaks wire version (\d+)", message)
    if m is not None:
        return f"the peer speaks wire version {m.group(1)}; {ours}: {same}"
    m = re.search(r"speaks protocol auth (\d+), newer", message)
    if m is not None:
        return f"the other side speaks auth {m.group(1)}; {ours}: {same}"
    if "upgrade rq on the" in message:
        # a peer from before mutual authentication (auth 2): it sends or checks no receiver proof
        return f"{ours}; the other side is older (auth 1, no receiver proof): {same}"
    return None


def _host_port(text: str, default_port: int = 7420) -> tuple[str, int]:
    # [0-9], not \d: `rq://host:٩` connected to port 9
    m = re.match(r"^\[([^\]]+)\](?::([0-9]+))?$", text) or re.match(r"^([^:]*)(?::([0-9]+))?$", text)
    if not m:
        raise CliError(f"{text!r} is not HOST:PORT", ExitCode.USAGE)
    port = int(m.group(2)) if m.group(2) else default_port
    if not 0 <= port <= 65535:
        raise CliError(f"port {port} out of range in {text!r}", ExitCode.USAGE)
    return m.group(1) or "127.0.0.1", port


def _is_default(param: str) -> bool:
    source = click.get_current_context().get_parameter_source(param)
    return source in (None, click.core.ParameterSource.DEFAULT)


def _parse_url(url: str) -> tuple[str, int, str | None]:
    """rq://HOST[:PORT][?pin=sha256:…], or HOST:PORT without the scheme.

    A bare word or a path is refused rather than taken for a host: `rq send a b` (the destination
    forgotten) would otherwise try host `b` on the default port for a minute and say "re-run"."""
    shown = safe_text(repr(url))
    if "://" not in url:
        if os.path.exists(url):
            raise CliError(
                f"destination {shown} is a local path: the last argument must be rq://HOST:PORT",
                ExitCode.USAGE,
            )
        if "/" in url or not re.search(r":\d+(\?|$)", url):
            raise CliError(f"destination {shown} must look like rq://HOST:PORT", ExitCode.USAGE)
        url = "rq://" + url
    try:
        parts = urlsplit(url)
        parts.hostname  # noqa: B018 - urlsplit checks a bracketed host only when asked for it
    except ValueError as exc:  # `rq://[]:5`, `rq://[nope]`: "unexpected ValueError" before
        raise CliError(f"destination {shown} is not a URL: {exc}", ExitCode.USAGE) from None
    if parts.scheme.lower() != "rq":
        raise CliError(f"destination {shown} must look like rq://HOST:PORT", ExitCode.USAGE)
    if parts.fragment:
        raise CliError(f"destination {shown} has a #fragment: give rq://HOST:PORT only", ExitCode.USAGE)
    if parts.path not in ("", "/"):
        # rq://host:port/some/dir: the receiver alone names where files go (its DEST_DIR)
        raise CliError(
            f"destination {shown} has a path: files go where `rq recv DEST_DIR` was started; "
            "give rq://HOST:PORT only",
            ExitCode.USAGE,
        )
    if not parts.hostname:
        # `rq://$HOST:7420` with HOST unset: it sent to this machine's own receiver (127.0.0.1)
        raise CliError(
            f"destination {shown} names no host (an unset variable?): give rq://HOST:PORT", ExitCode.USAGE
        )
    if "@" in parts.netloc:
        raise CliError(
            f"destination {shown} names a user: the token authorises a sender (--token-file, RQ_TOKEN); "
            "give rq://HOST:PORT",
            ExitCode.USAGE,
        )
    host, port = _host_port(parts.netloc)
    if port == 0:
        raise CliError(f"destination {shown} has port 0: give the port `rq recv` printed", ExitCode.USAGE)
    query = parse_qs(parts.query, keep_blank_values=True)
    if set(query) - {"pin"} or len(query.get("pin", [])) > 1:
        raise CliError(
            f"destination {shown}: the only thing an rq URL may carry after ? is one pin=sha256:…",
            ExitCode.USAGE,
        )
    pins = query.get("pin")
    pin = pins[0] if pins else None
    return host, port, pin


def _transport_extra(
    datagram_size: int | None,
    quic_backend: str,
    rdma_device: str | None,
    rdma_port: int | None,
    gid_index: int | None,
) -> dict[str, Any]:
    extra: dict[str, Any] = {"quic_backend": quic_backend}
    if datagram_size:
        extra["datagram_size"] = datagram_size
    for key, value in (("rdma_device", rdma_device), ("rdma_port", rdma_port), ("gid_index", gid_index)):
        if value is not None:
            extra[key] = value
    return extra


# Options that mean something for some transports only -> (those transports, why it is refused).
_TRANSPORT_ONLY: dict[str, tuple[tuple[str, ...], str]] = {
    "tls": (("tcp",), "QUIC and RDMA always set up over TLS with the pinned certificate"),
    "datagram_size": (("quic",), "only QUIC sends datagrams"),
    "quic_backend": (("quic",), "it picks the QUIC library"),
    "rdma_device": (("rdma",), "it names an RDMA device"),
    "rdma_port": (("rdma",), "it names an RDMA device's port"),
    "gid_index": (("rdma",), "it picks an RDMA GID"),
    "workers": (("quic",), "TCP and RDMA receive in threads of one process"),
}


def _refuse_other_transports_flags(ctx: click.Context, transport: str) -> None:
    """A flag typed for another transport would be ignored without a word, and a script that
    passes one believes it took effect (as with --pin on plain TCP). Only the command line is
    checked: RQ_* variables and the config file hold settings for whichever transport runs."""
    for param in ctx.command.params:
        rule = _TRANSPORT_ONLY.get(param.name or "")
        if rule is None or transport in rule[0]:
            continue
        if ctx.get_parameter_source(param.name or "") is not click.core.ParameterSource.COMMANDLINE:
            continue
        if param.name == "workers" and ctx.params.get("workers") == 1:
            continue  # one process is what TCP and RDMA do anyway
        flag = param.opts[0] if param.name != "tls" else ("--tls" if ctx.params.get("tls") else "--no-tls")
        raise CliError(
            f"{flag} is for --transport {' / '.join(rule[0])} only ({rule[1]}); "
            f"with --transport {transport} it would be ignored: drop it",
            ExitCode.USAGE,
        )


def _quick_gil_handoff(transport: str) -> None:
    """QUIC runs aioquic in an event-loop thread that holds the GIL almost all the time; the threads
    that read, hash and write chunks wait up to the switch interval (5 ms) for it after every syscall.
    A shorter interval keeps them from stalling the pipe (measured: ~10-30% on loopback, noisy)."""
    if transport == "quic":
        sys.setswitchinterval(0.001)


def default_streams(transport: str) -> int:
    """QUIC multiplexes streams over one connection and gains from 2. Over TCP each channel is a
    connection of its own, and on loopback/2 cores a second one only adds CPU (the receiver's copies
    and page-cache writes are the limit): one connection used ~10-20% less CPU for the same wall
    time in `scripts/bench/transfer.py --only tcp --tcp-streams 1,2` (docs/bench/RESULTS.md)."""
    return 1 if transport == "tcp" else 2


def _common(func: Any) -> Any:
    options = [
        click.option(
            "--transport",
            type=click.Choice(["quic", "tcp", "rdma"]),
            default="quic",
            show_default=True,
            help="quic: TLS 1.3, pinned cert; tcp: fastest on trusted links; rdma: needs a device, sets up over TLS but moves data UNENCRYPTED (trusted fabric only, docs/rdma.md).",
        ),
        click.option(
            "--token-file",
            type=NonEmptyPath(dir_okay=False, path_type=Path),
            help="Shared secret (default: RQ_TOKEN, else ~/.config/rq/transfer-token).",
        ),
        click.option(
            "--tls/--no-tls",
            "tls",
            default=None,
            help="TCP only: wrap channels in TLS with the pinned certificate (QUIC always has TLS).",
        ),
        click.option(
            "--datagram-size",
            type=DATAGRAM_RANGE,
            help="QUIC UDP payload size, 1200-65000 (aioquic: at most 16383) [default: largest the path allows].",
        ),
        click.option(
            "--quic-backend",
            type=click.Choice(["auto", "aioquic", "qh3"]),
            default="auto",
            show_default=True,
            help="auto uses qh3 when installed, else aioquic.",
        ),
        click.option("--rdma-device", help="RDMA only: device name (e.g. mlx5_0)."),
        click.option("--rdma-port", type=Whole(1, 255), help="RDMA only: device port."),
        click.option("--gid-index", type=Whole(0, 255), help="RDMA only: GID index (RoCE)."),
    ]
    for opt in reversed(options):
        func = opt(func)
    return func


# ---------------------------------------------------------------------------------------------- recv


def _dest_argument(_ctx: click.Context, _param: click.Parameter, value: str) -> Path:
    if not value:
        # Path("") is ".": an unset "$DEST" would receive into the working directory (as for SOURCE)
        raise CliError("DEST_DIR is an empty string (an unset variable?)", ExitCode.USAGE)
    return Path(value)


@click.command("recv")
@click.argument("dest_dir", type=click.Path(file_okay=False), callback=_dest_argument)
@click.option(
    "--listen",
    type=NonEmptyText(),
    default="127.0.0.1:7420",
    show_default=True,
    help="HOST:PORT to listen on (port 0: any).",
)
@_common
@click.option("--once", is_flag=True, help="Exit after one transfer completes.")
@click.option("--overwrite", is_flag=True, help="Replace files that already exist in DEST_DIR.")
@click.option(
    "--max-bytes",
    metavar="SIZE",
    callback=_positive_size_option,
    help="Refuse transfers larger than SIZE (e.g. 500G).",
)
@click.option(
    "--max-files",
    type=Whole(min=1),
    default=100_000,
    show_default=True,
    help="Refuse manifests with more files.",
)
@click.option(
    "--cert-dir",
    type=NonEmptyPath(file_okay=False, path_type=Path),
    help="Where the receiver keeps its TLS certificate (default: rq's data dir).",
)
@click.option(
    "--workers",
    type=Whole(1, 64),
    default=1,
    show_default=True,
    help="QUIC: receive in N processes (the extra ones on ports of their own, told to the sender); match the sender's --connections.",
)
@click.option(
    "--keep-partial",
    type=Age(),
    default="7d",
    show_default=True,
    help="As it starts, remove the partial state of transfers nothing touched for this long (their "
    "sender may resume until then): 90s, 30m, 12h, 7d, 2w; never or 0 keeps it.",
)
@click.option("--worker", is_flag=True, hidden=True, help="Internal: one of the processes of --workers.")
@click.option(
    "--receiver-id", hidden=True, help="Internal: the id a --workers process shares with its parent."
)
@click.option(
    "--parent-pid", type=Whole(min=1), hidden=True, help="Internal: the pid of a --workers process's parent."
)
@output_options
def recv(
    dest_dir: Path,
    listen: str,
    transport: str,
    token_file: Path | None,
    tls: bool | None,
    datagram_size: int | None,
    quic_backend: str,
    rdma_device: str | None,
    rdma_port: int | None,
    gid_index: int | None,
    once: bool,
    overwrite: bool,
    max_bytes: int | None,
    max_files: int,
    cert_dir: Path | None,
    workers: int,
    keep_partial: float | None,
    worker: bool,
    receiver_id: str | None,
    parent_pid: int | None,
) -> None:
    """Receive checkpoints into DEST_DIR; prints the line to paste on the sender.

    \b
    Example:
      rq recv /data/ckpt --listen 0.0.0.0:7420 --once
      (on the sender) rq send ckpt/ rq://10.0.0.2:7420 --pin sha256:…
    """
    from transfer.credentials import load_identity, load_token
    from transfer.errors import TransferError
    from transfer.hostaddr import reachable_address
    from transfer.manifest import Limits
    from transfer.receiver import Receiver
    from transfer.transport import ListenOptions, get_transport

    out = get_output()
    _refuse_other_transports_flags(click.get_current_context(), transport)
    _quick_gil_handoff(transport)
    if worker:
        from transfer.procs import die_with_parent

        # the pid the parent passed, not a parent pid of 1: rq as PID 1 (a container) is its parent
        if not die_with_parent(parent_pid or os.getppid()):
            raise CliError("the rq recv that started this worker is gone", ExitCode.FAILURE)
    spawn = workers > 1 and transport == "quic" and not worker
    cert_dir = cert_dir or user_data_path("rq") / "transfer"
    if (
        listen.isdigit()
    ):  # `--listen 7420`: a port alone read as a host name, "not an address of this machine"
        raise CliError(
            f"--listen takes HOST:PORT: give 127.0.0.1:{listen} (this machine only) or 0.0.0.0:{listen} "
            "(every address)",
            ExitCode.USAGE,
        )
    host, port = _host_port(listen)
    use_tls = True if transport in ("quic", "rdma") else bool(tls)  # RDMA sets up over TLS
    # one id for this receiver and its --workers processes: they share transfers, another rq recv
    # on the same DEST does not (docs/transfer.md)
    receiver_id = receiver_id or os.urandom(8).hex()
    try:
        token = load_token(
            token_file or (None if os.environ.get("RQ_TOKEN") else _default_token_file()),
            os.environ.get("RQ_TOKEN"),
            create=True,
        )
        identity = load_identity(cert_dir)
        driver = get_transport(transport)
        opts = ListenOptions(
            host,
            port,
            identity,
            tls=use_tls,
            extra={
                **_transport_extra(datagram_size, quic_backend, rdma_device, rdma_port, gid_index),
            },
        )
    except TransferError as exc:
        raise _cli_error(exc) from None
    except OSError as exc:
        raise _setup_error(exc, dest_dir) from None
    # Bind before DEST is touched: a --listen that cannot be bound must not leave an empty DEST
    # (and DEST/.rq-partial) behind. Channels that arrive meanwhile wait for the receiver.
    handler = _Deferred()
    listener = _listen(driver, opts, handler, listen)
    try:
        receiver = Receiver(
            dest_dir,
            token,
            Limits(max_bytes=max_bytes, max_files=max_files),
            overwrite,
            on_event=lambda ev: _recv_event(out, ev, dest_dir),
            owner=receiver_id,
            keep_partial=None if worker else keep_partial,  # the parent swept before the workers
        )
    except (TransferError, OSError) as exc:
        handler.set(None)
        listener.close()
        if isinstance(exc, TransferError):
            raise _cli_error(exc) from None
        raise _setup_error(exc, dest_dir) from None
    handler.set(receiver.handle_channel)
    _report_expired(out, receiver.expired)
    addr_host, addr_port = listener.address
    # a wildcard: an address of this machine others can reach (the host name resolved to
    # 127.0.1.1 on Debian-style hosts, and the pasted line sent to the sender's own machine)
    shown_host = reachable_address(addr_host) if addr_host in ("0.0.0.0", "::") else addr_host
    url_host = f"[{shown_host}]" if ":" in shown_host else shown_host
    pin = identity.fingerprint if use_tls else None
    line = f"rq send SOURCE rq://{url_host}:{addr_port} --transport {transport}"
    if transport == "tcp" and use_tls:
        line += " --tls"
    if pin:
        line += f" --pin {pin}"
    if token_file is not None:
        line += f" --token-file {shlex.quote(str(token_file))}"
    if spawn:
        line += f" --connections {workers}"
    children: list[subprocess.Popen[bytes]] = []
    ports: dict[subprocess.Popen[bytes], int] = {}  # live workers' data ports
    relays: list[threading.Thread] = []  # each worker's JSON lines, until it exits
    cut: list[dict[str, Any]] = []  # `interrupted` lines: transfers stopped mid-way, workers' too
    done_by_workers: list[str] = []  # transfer ids the --workers children committed (their `done`)
    if spawn:  # each worker process listens on a port of its own; ACCEPT tells senders which
        child_args = [
            "--json",
            *["-v"] * min(out.verbose, 2),  # their library logs on the shared stderr too
            "recv",
            str(dest_dir),
            "--listen",
            _address(addr_host, 0),
            "--transport",
            transport,
            "--worker",
            "--cert-dir",
            str(cert_dir),
            "--max-files",
            str(max_files),
            "--quic-backend",
            quic_backend,
            "--receiver-id",
            receiver_id,
            "--parent-pid",
            str(os.getpid()),
        ]
        for flag, value in (
            ("--token-file", token_file),
            ("--datagram-size", datagram_size),
            ("--max-bytes", max_bytes),
        ):
            if value is not None:
                child_args += [flag, str(value)]
        child_args += ["--once"] * once + ["--overwrite"] * overwrite
        started = [_start_worker(child_args, out, relays, cut, done_by_workers) for _ in range(workers - 1)]
        children = [proc for proc, _ in started]
        ports = dict(started)
        receiver.data_ports = [addr_port] + [port for _, port in started]
    # before the listening line: a script may send SIGTERM as soon as it has read it
    stop = threading.Event()
    stopped_by: list[str] = []

    def _stop(signum: int, _frame: Any) -> None:
        stopped_by.append(signal.Signals(signum).name)
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGHUP):  # a terminal or ssh session gone: as SIGTERM
        if signal.getsignal(signum) is not signal.SIG_IGN:  # (nohup: stays ignored)
            signal.signal(signum, _stop)
    if worker:
        # the parent's "we are done" (_stop_workers): installed before the listening line it waits for
        signal.signal(WORKER_STOP, _stop)
    out.emit(
        {
            "event": "listening",
            "address": _address(addr_host, addr_port),
            "transport": transport,
            "pin": pin,
            "send": line,
        }
    )
    if out.quiet:
        # -q drops chatter, not answers: the line to paste is how a script learns a `:0` port
        out.result(line)
    out.info(f"receiving into {dest_dir} on {_address(addr_host, addr_port)}; on the sender run:\n  {line}")
    if token_file is None and not os.environ.get("RQ_TOKEN") and not worker:
        out.info(
            f"  (with the token from {_default_token_file()} copied to the same place there, or RQ_TOKEN)"
        )

    died: list[BaseException] = []  # why the listener stopped, when it stops on its own
    server = threading.Thread(target=_serve, args=(listener, died), daemon=True)
    server.start()
    try:
        with out.progress() as bar:
            receiver.on_event = _recv_progress(out, bar, dest_dir)
            while not stop.is_set() and server.is_alive():
                _drop_dead_workers(receiver, ports, out)
                # with --workers, the transfer's control channel may have landed in a child
                if once and (receiver.completed.wait(0.2) or any(c.poll() == 0 for c in children)):
                    break
                if not once:
                    stop.wait(0.5)
            by_parent = stopped_by[:1] == [WORKER_STOP.name]
            if stop.is_set() and once and not receiver.completed.is_set() and not by_parent:
                # (a worker its parent stops at the end says nothing: the parent speaks for it)
                # a script waiting for one transfer must not read "received" from a kill
                raise CliError(
                    f"stopped by {stopped_by[0] if stopped_by else 'SIGTERM'} before a transfer completed",
                    ExitCode.INTERRUPTED,
                )
            if not stop.is_set() and not server.is_alive():
                # nobody asked it to stop: exiting 0 here would tell a script all went well
                reason = f": {safe_text(str(died[0]))}" if died else ""
                raise CliError(f"the listener stopped{reason}", ExitCode.FAILURE)
    except KeyboardInterrupt:
        raise click.exceptions.Abort() from None
    finally:
        # before the channels close: what this process was serving when it was stopped
        with contextlib.suppress(Exception):
            cut += [_interrupted(m) for m in receiver.in_flight()]
        listener.close()
        server.join(timeout=5)
        _stop_workers(children)
        for relay in relays:
            relay.join(timeout=5)  # the workers' own `interrupted` lines (they have exited)
        cut[:] = _still_cut(cut, receiver.store)
        receiver.close()
        _report_cut(out, cut, worker)
        _say_data_arrived(out, dest_dir, receiver.committed + len(set(done_by_workers)))


def _say_data_arrived(out: Output, dest_dir: Path, committed: int) -> None:
    """With stdout unwritable (`>&-`, `> /dev/full`), rq recv still receives (the data is its job)
    and ends with exit 1 and one line naming stdout (docs/cli.md). That line alone read as if the
    transfer had failed, after it had landed whole: it now says what arrived."""
    failed = out.stdout_failed
    if failed is None:
        return
    arrived = (
        f"{committed} transfer(s) were received and verified into {safe_text(str(dest_dir))} all the same"
        if committed
        else "no transfer completed"
    )
    out.stdout_failed = StdoutError(
        f"{failed.message}; {arrived}, only the report was not written", failed.code
    )


# How `rq recv --workers` tells its worker processes it is done. Not SIGTERM: a worker cannot tell
# its parent's SIGTERM from anybody else's, and a --once worker that had not seen the transfer
# complete (its parent had) said "stopped by SIGTERM before a transfer completed" on the shared
# stderr after a verified transfer. A SIGTERM from elsewhere (or from the kernel as the parent dies)
# is answered as before, and the parent reports a worker that ended on its own (_drop_dead_workers).
WORKER_STOP = signal.SIGUSR1


def _stop_workers(children: list[subprocess.Popen[bytes]]) -> None:
    for child in children:
        if child.poll() is None:
            child.send_signal(WORKER_STOP)
    for child in children:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=10)


def _setup_error(exc: OSError, dest_dir: Path) -> Exception:
    """What `rq recv` says when DEST, the token file or the cert dir cannot be used."""
    if exc.filename is None:
        return exc
    where = safe_text(os.fsdecode(exc.filename))
    why = exc.strerror or str(exc)
    if exc.errno == errno.EROFS or (
        exc.errno in (errno.EACCES, errno.EPERM) and os.fsdecode(exc.filename) == os.fspath(dest_dir)
    ):
        why = f"not writable ({why})"
    # a file where a directory must be (DEST or a parent of it) is a usage error, as Click's own
    # check of a DEST that is a file and every other rq command's directory options have it
    code = ExitCode.USAGE if exc.errno == errno.ENOTDIR else ExitCode.FAILURE
    hint = None
    if not _within(Path(os.fsdecode(exc.filename)), dest_dir):
        # the certificate or the token's default place (under HOME): in a container with a
        # read-only root and HOME=/ the line named /.local and nothing to do about it (ct)
        hint = (
            "rq recv keeps its TLS certificate in --cert-dir (default under ~/.local/share/rq) and "
            "the token in --token-file (default under ~/.config/rq) unless RQ_TOKEN is set: "
            "point them at a writable directory"
        )
    return CliError(f"cannot use {where}: {why}", code, hint=hint)


def _within(path: Path, directory: Path) -> bool:
    """Whether `path` is `directory` or under it (absolute, as given: no symlinks followed)."""
    path, directory = Path(os.path.abspath(path)), Path(os.path.abspath(directory))
    return path == directory or directory in path.parents


class _Deferred:
    """The listener's channel handler before the receiver exists (it is made after the bind):
    a channel that arrives meanwhile waits for it, or is closed if it never comes."""

    def __init__(self) -> None:
        self._ready = threading.Event()
        self._target: Callable[[Any], None] | None = None

    def set(self, target: Callable[[Any], None] | None) -> None:
        self._target = target
        self._ready.set()

    def __call__(self, ch: Any) -> None:
        self._ready.wait()
        if self._target is None:
            with contextlib.suppress(Exception):
                ch.close()
            return
        self._target(ch)


def _address(host: str, port: int) -> str:
    """HOST:PORT as --listen and rq:// take it back: an IPv6 address in brackets ([::]:7420)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# a listen address that cannot be bound is the user's to change (2), never an unreachable peer (6)
_BIND_USAGE = {errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES, errno.EAFNOSUPPORT, errno.EINVAL}


def _listen(driver: Any, opts: Any, handler: Callable[[Any], None], listen: str) -> Any:
    from transfer.errors import TransferError

    try:
        return driver.listen(opts, handler)
    except TransferError as exc:
        raise _cli_error(exc) from None
    except OSError as exc:
        # socket.create_server says where in strerror; the line names --listen already
        why = (exc.strerror or str(exc)).split(" (while attempting to bind")[0]
        # a name that does not resolve: gaierror, or create_server's OSError with its EAI_* (< 0)
        unresolved = isinstance(exc, socket.gaierror) or (exc.errno or 0) < 0
        if unresolved:
            why = f"{why}: HOST must be an address or name of this machine"
        elif exc.errno == errno.EADDRNOTAVAIL:
            why = f"{why}: HOST is not an address of this machine"
        elif exc.errno == errno.EADDRINUSE:
            why = f"{why}: another process listens there (pick another port, or port 0 for any)"
        usage = unresolved or exc.errno in _BIND_USAGE
        code = ExitCode.USAGE if usage else ExitCode.FAILURE
        raise CliError(f"cannot listen on {safe_text(listen)}: {why}", code) from None


def _drop_dead_workers(receiver: Any, ports: dict[subprocess.Popen[bytes], int], out: Output) -> None:
    """A worker that died (OOM, kill -9) stops being offered to senders: they kept retrying its
    port on every transfer, ten times slower, and nobody was told."""
    for child in [c for c in ports if c.poll() not in (None, 0)]:
        port = ports.pop(child)
        receiver.data_ports = [p for p in receiver.data_ports if p != port]
        out.warn(
            f"a --workers receiver process (data port {port}) died (exit {child.returncode}); "
            f"going on with {len(receiver.data_ports)} process(es)"
        )


def _serve(listener: Any, died: list[BaseException]) -> None:
    """The listener's loop, keeping what stopped it for the main thread (no thread traceback)."""
    try:
        listener.serve_forever()
    except Exception as exc:
        died.append(exc)


def _interrupted(m: Any) -> dict[str, Any]:
    return {
        "event": "interrupted",
        "transfer_id": m.transfer_id,
        "files": len(m.files),
        "bytes": m.total_bytes,
    }


def _still_cut(cut: list[dict[str, Any]], store: Any) -> list[dict[str, Any]]:
    """The `interrupted` events whose transfer has not finished here since: a worker someone else
    stopped hours ago cut a transfer that its sender's re-run has completed by the time the parent
    stops (review). A store that cannot tell keeps them all."""
    try:
        return [ev for ev in cut if not store.has_finished(str(ev.get("transfer_id")))]
    except Exception:
        return cut


def _report_cut(out: Output, cut: list[dict[str, Any]], worker: bool) -> None:
    """The transfers a stopped `rq recv` cut off mid-way (SIGTERM does not wait for them: docs/
    transfer.md), once each: the parent of --workers reports its workers' too, and a worker only
    tells its parent (its JSON line), never the stderr they share."""
    seen: set[Any] = set()
    for ev in cut:
        if ev.get("transfer_id") in seen:
            continue
        seen.add(ev.get("transfer_id"))
        out.emit(ev)
        if not worker:
            out.warn(
                f"stopped transfer {safe_text(str(ev.get('transfer_id')))[:12]} mid-way ({ev.get('files')} "
                f"file(s), {ev.get('bytes')} bytes): what arrived is kept, and the sender's re-run of "
                "the same command resumes it"
            )


def _start_worker(
    args: list[str],
    out: Output,
    relays: list[threading.Thread],
    cut: list[dict[str, Any]],
    done: list[str],
) -> tuple[subprocess.Popen[bytes], int]:
    """Starts one more receiver process, returns it and its port, and relays its JSON events (its
    `interrupted` lines go to `cut`, for the parent to report once; the thread to `relays`)."""
    import orjson

    proc = subprocess.Popen([sys.executable, "-m", "rqcli", *args], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    first = proc.stdout.readline()
    try:
        port = int(str(orjson.loads(first)["address"]).rsplit(":", 1)[1])
    except (ValueError, KeyError, IndexError):
        proc.kill()
        raise CliError("a --workers receiver process failed to start", ExitCode.FAILURE) from None

    def relay(stream: Any) -> None:
        for raw in stream:
            with contextlib.suppress(ValueError):
                ev = orjson.loads(raw)
                if ev.get("event") == "done":
                    done.append(str(ev.get("transfer_id")))
                if ev.get("event") == "interrupted":
                    cut.append(ev)
                elif out.json:
                    out.emit(ev)
                elif ev.get("event") == "done":
                    out.info(
                        f"transfer {str(ev.get('transfer_id'))[:12]} complete and verified: "
                        f"{ev.get('files')} file(s), {ev.get('bytes')} bytes"
                    )
                elif ev.get("event") == "refused":
                    out.warn(f"refused a transfer: {ev.get('error')}")

    thread = threading.Thread(target=relay, args=(proc.stdout,), daemon=True)
    thread.start()
    relays.append(thread)
    return proc, port


def _recv_progress(out: Output, bar: Any, dest: Path | None = None) -> Any:
    """Events → JSON lines and text (_recv_event), plus one rich bar per transfer on a terminal."""
    from transfer.events import ChunkMoved, TransferFailed, TransferFinished, TransferPlanned

    tasks: dict[str, Any] = {}
    current: list[Any] = [None]
    shown: dict[Any, tuple[int, int]] = {}  # task: (bytes shown, total)
    lock = threading.Lock()

    def show(task: Any, done: int) -> None:
        # never backwards: a sender that reconnects re-plans from what the journal holds, which
        # leaves out chunks that were in flight when the link dropped (they come again); never
        # past the total either, which those chunks' second arrival would otherwise push it to
        was, total = shown[task]
        shown[task] = (max(was, min(done, total)), total)
        bar.update(task, completed=shown[task][0])

    def on_event(ev: Any) -> None:
        _recv_event(out, ev, dest)
        if bar is None:
            return
        with lock:
            if isinstance(ev, TransferPlanned):
                task = tasks.get(ev.transfer_id)
                if task is None:
                    # starting at what is already here: a heartbeat's first rate and time left
                    # count only what this run moves
                    task = tasks[ev.transfer_id] = bar.add_task(
                        f"recv {ev.transfer_id[:8]}", total=ev.total_bytes, completed=ev.have_bytes
                    )
                    shown[task] = (0, ev.total_bytes)
                show(task, ev.have_bytes)
                current[0] = task
            elif isinstance(ev, ChunkMoved) and current[0] is not None:
                show(current[0], shown[current[0]][0] + ev.raw_bytes)
            elif isinstance(ev, TransferFinished):
                task = tasks.get(str(ev.summary.get("transfer_id")))
                if task is not None:
                    bar.update(task, completed=ev.summary.get("bytes", 0))
            elif isinstance(ev, TransferFailed) and current[0] is not None:
                # refused (disk full, a cap, a bad manifest): its bar says no more, no time left
                # after "refused"; a re-run of the send starts a new one
                bar.remove_task(current[0])
                for tid in [k for k, v in tasks.items() if v == current[0]]:
                    del tasks[tid]
                current[0] = None

    return on_event


def _recv_event(out: Output, ev: Any, dest: Path | None = None) -> None:
    from transfer.events import PartialExpired, TransferFailed, TransferFinished, TransferPlanned

    if isinstance(ev, TransferPlanned):
        out.emit(
            {
                "event": "transfer",
                "transfer_id": ev.transfer_id,
                "files": ev.files,
                "bytes": ev.total_bytes,
                "have_bytes": ev.have_bytes,
                "restarted": list(ev.restarted),
            }
        )
        if ev.restarted:
            out.warn(
                f"source changed since the last attempt; restarting {len(ev.restarted)} file(s): "
                f"{_some_names(ev.restarted, len(ev.restarted))}"
            )
        resume = f", {ev.have_bytes} already here" if ev.have_bytes else ""
        out.info(f"transfer {ev.transfer_id[:12]}: {ev.files} file(s), {ev.total_bytes} bytes{resume}")
    elif isinstance(ev, TransferFinished):
        out.emit({"event": "done", **ev.summary})
        out.info(
            f"transfer {str(ev.summary.get('transfer_id'))[:12]} complete and verified: "
            f"{ev.summary.get('files')} file(s), {ev.summary.get('bytes')} bytes"
        )
    elif isinstance(ev, TransferFailed):
        out.emit({"event": "refused", "code": ev.code, "error": safe_text(ev.error)})
        # the sender is told no path of the receiver's; its own line names DEST
        where = f" (DEST {safe_text(str(dest))})" if dest is not None and ev.code == "no-space" else ""
        out.warn(f"refused a transfer{where}: {safe_text(ev.error)}")
    elif isinstance(ev, PartialExpired):
        _report_expired(out, ev)  # the periodic sweep of a receiver that stays up


# ---------------------------------------------------------------------------------------------- send


@click.command("send")
@click.argument("args", nargs=-1, required=True, metavar="SOURCE... rq://HOST:PORT")
@_common
@click.option(
    "--pin",
    envvar="RQ_PIN",
    cls=CommandEnvFirst,
    metavar="SHA256",
    help="Receiver certificate fingerprint (sha256:…) printed by `rq recv`; also the URL's ?pin= or RQ_PIN.",
)
@click.option(
    "--connections",
    type=Whole(1, 64),
    default=1,
    show_default=True,
    help="Parallel connections (QUIC: one process each).",
)
@click.option(
    "--streams",
    type=Whole(1, 64),
    default=None,
    help="Channels per connection (QUIC streams; extra TCP connections). [default: 2; TCP: 1]",
)
@click.option(
    "--chunk-size",
    default="4MiB",
    show_default=True,
    metavar="SIZE",
    callback=_size_option,
    help="Chunk size, 64KiB to 64MiB (a receiver that holds part of the transfer picks it on resume).",
)
@click.option(
    "--compress",
    type=click.Choice(["auto", "zstd", "none"]),
    default="auto",
    show_default=True,
    help="auto: zstd (byte-grouped for floats) per chunk, raw where it would not shrink.",
)
@click.option(
    "--retry-for",
    type=Seconds(),
    default=60.0,
    show_default=True,
    help="Keep reconnecting for this many seconds without progress. A receiver that never "
    "answered is tried for 10 s by default, for this long when given (start before the receiver).",
)
@click.option(
    "--timeout",
    "ack_timeout",
    type=Seconds(),
    default=120.0,
    show_default=True,
    help="Drop a connection over which nothing moves for this many seconds while chunks wait "
    "(no byte reaches the receiver and it confirms nothing: stopped, hung, or its disk stalled); "
    "--retry-for then decides whether to reconnect. Bytes still draining count as movement, so a "
    "slow link is not taken for a stalled receiver. After COMMIT, a receiver that reports its "
    "progress is taken for stalled after 15 s of silence; an older one is waited for this long, "
    "at least 120 s. 0: wait for ever. Below 10 s it is also the connect timeout: a receiver that "
    "never answers is given up after it (with --retry-for, each try takes at most this long).",
)
@click.option(
    "--follow-symlinks",
    is_flag=True,
    help="Also follow symlinks out of a directory SOURCE that another user made (skipped by "
    "default, with a warning: a planted link must not send your files), and symlinks to "
    "directories: their trees are sent under the links' names, as cp -rL does (a link back to a "
    "directory above it is skipped). Yours and root's links to files are followed anyway, so a "
    "Hugging Face snapshot's links to its blobs send the blobs.",
)
@output_options
def send(**kwargs: Any) -> None:
    """Send files and directories to `rq recv`; re-run the same command to resume.

    A directory arrives under its own name, with or without a trailing / (ckpt/ arrives as
    DEST/ckpt/, like cp -r; not its contents only, as rsync would).

    \b
    Example:
      rq send ckpt/ rq://10.0.0.2:7420 --pin sha256:3f…  --connections 4
    """
    out = get_output()
    said: list[bool] = []  # a summary was emitted
    try:
        _send(out, said, **kwargs)
    except BaseException as exc:
        # one that could not start (a SOURCE missing, bad arguments, Ctrl-C while it imported)
        # ends --json with a summary too, as every other failure does: `tail -n1` is the result
        # (docs/cli.md); before this function ran, rqcli.main prints it (not_started_summary)
        _emit_partial(out, None, _why(exc), said)
        raise


def _why(exc: BaseException) -> str:
    """The summary's `error` for what stopped a send: stderr's line, the value's source named."""
    if isinstance(exc, CliError):
        from rqcli.main import name_the_source

        return name_the_source(exc).one_line()
    if isinstance(exc, KeyboardInterrupt):
        return interruption(exc)
    if isinstance(exc, click.ClickException):
        return CliError(exc.format_message()).one_line()
    return f"{type(exc).__name__}: {exc}"


def _send(
    out: Output,
    said: list[bool],
    args: tuple[str, ...],
    transport: str,
    token_file: Path | None,
    tls: bool | None,
    datagram_size: int | None,
    quic_backend: str,
    rdma_device: str | None,
    rdma_port: int | None,
    gid_index: int | None,
    pin: str | None,
    connections: int,
    streams: int | None,
    chunk_size: int,
    compress: str,
    retry_for: float,
    ack_timeout: float,
    follow_symlinks: bool,
) -> None:
    from transfer.credentials import load_token, normalise_pin
    from transfer.errors import TransferError
    from transfer.manifest import MAX_CHUNK, MIN_CHUNK
    from transfer.sender import SendOptions
    from transfer.sender import send as do_send
    from transfer.transport import ConnectOptions, get_transport

    _refuse_other_transports_flags(click.get_current_context(), transport)
    _quick_gil_handoff(transport)
    if len(args) < 2:
        raise CliError("give at least one SOURCE and the rq://HOST:PORT destination", ExitCode.USAGE)
    sources, url = _distinct_sources(args[:-1], out), args[-1]
    for source in sources:
        # before the pin and the token: `rq send nope rq://…` without --pin said "no --pin" (exit 4)
        if not os.path.lexists(source):
            raise CliError(f"source not found: {safe_text(str(source))}", ExitCode.NOT_FOUND)
    host, port, url_pin = _parse_url(url)
    if pin and url_pin and pin != url_pin:
        # which one did the script mean? a silent choice would hide a stale fingerprint
        raise CliError("the destination's ?pin= and --pin (or RQ_PIN) differ: give one", ExitCode.USAGE)
    pin = pin or url_pin
    use_tls = True if transport in ("quic", "rdma") else bool(tls)  # RDMA sets up over TLS
    if not MIN_CHUNK <= (chunk_size or 0) <= MAX_CHUNK:
        raise CliError(f"--chunk-size must be between {MIN_CHUNK} and {MAX_CHUNK} bytes", ExitCode.USAGE)
    given = click.get_current_context().get_parameter_source("pin")
    if not use_tls and (url_pin or given is click.core.ParameterSource.COMMANDLINE):
        # a script passing a pin believes the certificate is checked: plain TCP has none to check
        raise CliError(
            "--pin checks the receiver's certificate, which TCP has only with TLS: add --tls "
            "(and run rq recv with --tls), or drop the pin",
            ExitCode.USAGE,
        )
    try:
        driver = get_transport(transport)  # first: "this machine has no RDMA" beats "no --pin"
        if use_tls:
            if not pin:
                raise CliError("no --pin: copy the sha256 fingerprint `rq recv` printed", ExitCode.AUTH)
            try:
                pin = normalise_pin(pin)
            except TransferError:
                raise CliError(
                    f"pin {safe_text(repr(pin))} is not a certificate fingerprint: expected sha256: and "
                    "64 hex digits, as `rq recv` prints it",
                    ExitCode.USAGE,
                ) from None
        token = load_token(
            token_file or (None if os.environ.get("RQ_TOKEN") else _default_token_file()),
            os.environ.get("RQ_TOKEN"),
            create=False,
        )
        copts = ConnectOptions(
            host,
            port,
            pin,
            tls=use_tls,
            extra=_transport_extra(datagram_size, quic_backend, rdma_device, rdma_port, gid_index),
        )
        opts = SendOptions(
            connections=connections,
            streams=streams or default_streams(transport),
            chunk_size=chunk_size or 0,
            compress=cast("CompressMode", compress),
            retry_for=retry_for,
            # --retry-for given (flag, RQ_SEND_RETRY_FOR, config) also covers a receiver not up yet
            first_connect_for=None if _is_default("retry_for") else retry_for,
            ack_timeout=ack_timeout,
            follow_symlinks=follow_symlinks,
        )
        with out.progress() as bar:
            on_event = _send_progress(out, bar)
            summary = do_send(sources, driver, copts, token, opts, on_event)
    except TransferError as exc:
        err = _cli_error(exc)
        if err.hint == _HINTS[ExitCode.UNREACHABLE]:
            err = CliError(err.message, err.code, hint=_unreachable_hint(transport))
        partial = getattr(exc, "partial_summary", None)
        if err.code == ExitCode.UNREACHABLE and partial and partial["resumable"]:
            # the receiver holds verified parts of it: exit 8, "re-run the same command to resume"
            err = CliError(err.message, ExitCode.RESUMABLE, hint="re-run the same command to resume")
        _emit_partial(out, partial, err.one_line(), said)
        raise err from None
    except FileNotFoundError as exc:
        raise CliError(f"source not found: {exc.filename}", ExitCode.NOT_FOUND) from None
    except BaseException as exc:  # Ctrl-C, SIGTERM, an unexpected error: the summary still comes last
        partial = getattr(exc, "partial_summary", None)
        _emit_partial(out, partial, _why(exc), said)
        if isinstance(exc, KeyboardInterrupt) and partial is not None:
            # rqcli.main's "stopped by SIGTERM" line goes on with what the receiver holds
            exc.rq_detail = _held_text(partial)  # type: ignore[attr-defined]
        raise
    out.emit({"event": "summary", **summary})
    if summary.get("already_complete"):
        out.info(
            f"sent {summary['files']} file(s), {summary['bytes_total']} bytes: already complete on "
            "the receiver (an earlier run finished it); nothing moved, verified"
        )
    else:
        resumed = summary.get("resumed_bytes") or 0
        out.info(
            f"sent {summary['files']} file(s)"
            + (f" and {summary['dirs']} empty director(ies)" if summary.get("dirs") else "")
            + f", {summary['bytes_total']} bytes: "
            + (f"{resumed} bytes already on the receiver (resumed), " if resumed else "")
            + f"{summary['bytes_raw']} moved "
            f"({summary['bytes_on_wire']} on the wire, ratio {summary['ratio']}) in {summary['seconds']}s, "
            f"{summary['mb_per_s']} MB/s, {summary['chunks_resent']} chunk(s) resent, verified"
            + (f"; {summary['skipped']} entries not sent (see above)" if summary.get("skipped") else "")
        )
    _say_data_sent(out, summary, url)


def _held_text(partial: dict[str, Any]) -> str:
    """What an interrupted send leaves on the receiver, for the line after "stopped by …"."""
    held, total = partial.get("chunks_held", 0), partial.get("chunks_total", 0)
    if not partial.get("resumable"):
        return (
            f"no confirmation of any of the transfer's {total} chunk(s) had come back yet: re-run the "
            "same command (it resumes from whatever the receiver holds)"
        )
    return (
        f"the receiver confirmed {held} of the transfer's {total} chunk(s) verified: re-run the same "
        "command to resume"
    )


NAMES_SHOWN = 5  # file names a warning lists before "and N more"


def _some_names(names: list[str] | tuple[str, ...], count: int) -> str:
    """The first NAMES_SHOWN names (made safe and short), and how many more there are."""
    from transfer.names import short_path

    shown = ", ".join(safe_text(short_path(n)) for n in names[:NAMES_SHOWN])
    more = count - min(len(names), NAMES_SHOWN)
    return shown + (f" and {more} more" if more > 0 else "")


def _say_data_sent(out: Output, summary: dict[str, Any], url: str) -> None:
    """With stdout unwritable (`>&-`, `> /dev/full`), rq send still sends (it goes on without
    stdout) and ends with exit 1 and one line naming stdout (docs/cli.md). That line alone read as
    a failed send after the receiver had verified every byte: it now says what was sent, as rq
    recv's says what arrived (_say_data_arrived)."""
    failed = out.stdout_failed
    if failed is None:
        return
    where = safe_text(url.split("?", 1)[0])  # not a ?pin= the URL may carry
    verified = " and verified by the receiver" if summary.get("verified") else ""
    out.stdout_failed = StdoutError(
        f"{failed.message}; the transfer completed all the same: {summary['files']} file(s), "
        f"{summary['bytes_total']} bytes sent to {where}{verified}, only the report was not written",
        failed.code,
    )


# The summary of a send that stopped before it had a manifest (a SOURCE missing or unreadable).
_NOT_STARTED: dict[str, Any] = {
    "transfer_id": None,
    "files": 0,
    "dirs": 0,
    "bytes_total": 0,
    "bytes_raw": 0,
    "bytes_on_wire": 0,
    "ratio": 1.0,
    "seconds": 0.0,
    "mb_per_s": 0.0,
    "chunks_sent": 0,
    "chunks_resent": 0,
    "chunks_acked": 0,
    "attempts": 0,
    "verified": False,
    "complete": False,
    "skipped": 0,
    "chunk_size": None,
    "resumable": False,
    "resumed_bytes": 0,
    "already_complete": False,
    "chunks_held": 0,
    "chunks_total": 0,
    "restarted": [],
    "restarted_count": 0,
}


def _emit_partial(out: Output, partial: dict[str, Any] | None, error: str, said: list[bool]) -> None:
    """The summary of a send that stopped before the end (`"complete": false`), so that `tail -n1`
    of --json output is its result whatever happened (docs/cli.md); `said` records that it was."""
    if not said:
        out.emit({"event": "summary", **(partial if partial is not None else _NOT_STARTED), "error": error})
        said.append(True)


def _distinct_sources(args: tuple[str, ...], out: Output) -> list[Path]:
    """The same SOURCE twice is sent once (with a warning); two different SOURCEs that would land
    under one name in DEST_DIR (a/x and b/x both arrive as x) are a usage error, said up front."""
    sources: list[Path] = []
    seen: set[tuple[Path, str]] = set()
    names: dict[str, str] = {}
    for arg in args:
        if not arg:
            # Path("") is ".": an unset "$CKPT" would send the working directory (cp, scp refuse it)
            raise CliError("SOURCE is an empty string (an unset variable?)", ExitCode.USAGE)
        path = Path(arg)
        if arg.endswith("/") and not os.path.isdir(arg) and os.path.lexists(path):
            # Path drops the slash: FILE/ was sent as FILE (cp, rsync and rq preload refuse it)
            raise CliError(
                f"source {safe_text(arg)} is a file, not a directory (drop the trailing /)",
                ExitCode.NOT_FOUND,
            )
        try:
            real = path.resolve()
        except (OSError, RuntimeError):  # a symlink loop (RuntimeError before Python 3.13)
            raise CliError(f"source not found: {safe_text(arg)}", ExitCode.NOT_FOUND) from None
        name = real.name if path.name in ("", ".", "..") else path.name  # as transfer.source names it
        if (real, name) in seen:
            out.warn(f"SOURCE {safe_text(arg)} given more than once; sending it once")
            continue
        if name in names:
            raise CliError(
                f"SOURCEs {safe_text(names[name])} and {safe_text(arg)} would both arrive as "
                f"{safe_text(repr(name))}; send them separately or rename one",
                ExitCode.USAGE,
            )
        seen.add((real, name))
        names[name] = arg
        sources.append(path)
    return sources


def _report_expired(out: Output, expired: Any) -> None:
    """What --keep-partial removed as rq recv started, or in a later sweep (at most hourly, as a
    transfer is planned): a line, and an `expired` JSON line."""
    if not expired.files:
        return
    out.emit(
        {
            "event": "expired",
            "transfers": list(expired.transfers),
            "files": expired.files,
            "bytes": expired.bytes,
            "older_than": expired.older_than,
        }
    )
    from cache.sizes import format_size

    out.info(
        f"removed the partial state of {len(expired.transfers)} transfer(s) untouched for "
        f"{Age.text(expired.older_than or 0)}: {expired.files} file(s), {format_size(expired.bytes)} freed"
    )


def _size_text(n: int) -> str:
    """A chunk size the way --chunk-size takes it back: 4 MiB, 256 KiB, or bytes."""
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} bytes"


SKIPPED_SHOWN = 10  # warnings for skipped entries before the rest are only counted


def _send_progress(out: Output, bar: Any) -> Any:
    from transfer.events import (
        ChunkResent,
        ChunkSizeAdopted,
        DatagramNarrowed,
        Retrying,
        SendProgress,
        SourceSkipped,
        TransferPlanned,
    )
    from transfer.names import short_path

    state: dict[str, Any] = {"task": None, "resent": 0, "skipped": 0, "restarted": False}
    lock = threading.Lock()

    def on_event(ev: Any) -> None:
        with lock:
            if isinstance(ev, SourceSkipped):
                out.emit({"event": "skipped", "path": safe_text(ev.path), "reason": ev.reason})
                state["skipped"] += 1
                if state["skipped"] <= SKIPPED_SHOWN:
                    out.warn(f"not sending {safe_text(short_path(ev.path))}: {ev.reason}")
                elif state["skipped"] == SKIPPED_SHOWN + 1:
                    out.warn("more entries not sent; --json lists them all")
            if isinstance(ev, ChunkSizeAdopted):
                out.emit({"event": "chunk_size", "chunk_size": ev.chunk_size, "asked": ev.asked})
                out.warn(
                    f"resuming with chunk size {_size_text(ev.chunk_size)}, the size the receiver's "
                    f"partial files were cut at (asked: {_size_text(ev.asked)}); what arrived is kept"
                )
            if isinstance(ev, DatagramNarrowed):
                out.emit({"event": "datagram_size", "datagram_size": ev.used, "tried": ev.tried})
                out.warn(
                    f"no answer at {ev.tried}-byte QUIC datagrams (the path is narrower than this "
                    f"machine's link): sending {ev.used}-byte datagrams, which is slower; "
                    "--datagram-size sets the size"
                )
            if isinstance(ev, Retrying):
                out.emit(
                    {
                        "event": "retry",
                        "attempt": ev.attempt,
                        "error": safe_text(ev.error),
                        "delay_s": ev.delay,
                    }
                )
                out.warn(f"connection problem ({safe_text(ev.error)}); retry {ev.attempt} in {ev.delay:.1f}s")
            if isinstance(ev, TransferPlanned) and ev.restarted and not state["restarted"]:
                state["restarted"] = True  # (said once: a reconnect's plan lists them again)
                out.warn(
                    "the receiver held parts of an earlier attempt whose source has changed since; "
                    f"sending these again whole: {_some_names(ev.restarted, ev.restarted_count or len(ev.restarted))}"
                )
            if bar is None:
                return
            if isinstance(ev, TransferPlanned):
                if state["task"] is None:
                    # from what the receiver holds: a heartbeat's first rate counts this run's bytes
                    state["task"] = bar.add_task("sending", total=ev.total_bytes, completed=ev.have_bytes)
            elif isinstance(ev, SendProgress) and state["task"] is not None:
                # never back after a reconnect (it jumped from 40% to 24%): docs/transfer.md
                bar.update(state["task"], completed=ev.done_bytes)
            elif isinstance(ev, ChunkResent) and state["task"] is not None:
                state["resent"] += 1
                bar.update(state["task"], description=f"sending ({state['resent']} resent)")

    return on_event


def _not_started(error: str) -> dict[str, Any]:
    return {"event": "summary", **_NOT_STARTED, "error": error}


# rqcli.main prints it under --json when Click refuses an argument or a signal comes before send ran
send.not_started_summary = _not_started  # type: ignore[attr-defined]

for _command, _name in ((send, "send"), (recv, "recv")):
    documented_env_names(_command, _name)
