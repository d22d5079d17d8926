"""`rq produce`, `rq tail`, `rq replay`, `rq offsets`: the face of the topics library.

Thin on purpose: option parsing, turning library errors into exit codes, and writing bytes the
library renders. The read loop, SPEC grammar, filters and formats live in topics/.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import fcntl
import itertools
import json
import logging
import os
import select
import signal
import socket
import stat
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import click
import orjson
from platformdirs import user_data_path

from rqcli.errors import CliError, Terminated, interruption
from rqcli.exitcodes import ExitCode
from rqcli.output import (
    Output,
    StdoutError,
    get_output,
    json_line,
    output_options,
    safe_text,
    stdout_error,
)
from rqcli.params import CommandEnvFirst, NonEmptyPath, Seconds, Whole, documented_env_names
from topics.embedded.format import MAX_BATCH_PAYLOAD, RECORD_SIZE
from topics.embedded.groups import check_group_name
from topics.embedded.log import TopicConfig
from topics.errors import (
    AccessDenied,
    AppendedPartly,
    AppendInterrupted,
    CommitNotDurable,
    ConnectionLost,
    CorruptRecord,
    DamagedGroup,
    DigestMismatch,
    NoResponders,
    PublishRefused,
    RecordTooLarge,
    SourceUnreachable,
    SpecError,
    SpecFileNotFound,
    SubjectNotTaken,
    TopicError,
    TopicNotFound,
    Unsupported,
    WriterBusy,
)
from topics.expr import compile_where
from topics.paths import Path as FieldPath
from topics.paths import parse_fields
from topics.pipeline import Rate, Request, Result, run
from topics.plan import parse_window, resolve_window
from topics.record import NO_HEADERS, Headers, Record, encode_bytes_field, encode_value, json_value_bytes
from topics.render import Decoded, Renderer, make_renderer
from topics.savedspec import ReplaySpec
from topics.sources import Appended, Sink, Source, open_sink, open_source, parse_topic
from topics.sources.base import Pending
from topics.sources.embedded import EmbeddedSink
from topics.sources.mqtt import PacketTooLarge
from topics.sources.open import TopicRef, check_writable
from topics.sources.subjects import subject_matches
from topics.spec import Position, parse_duration_ms, parse_position, resolve

BATCH_RECORDS = 8192
CHUNK = 1 << 20
# The longest input line that can be a record (the embedded log's limit: 256 MiB with the record's
# own framing); a longer one is refused while it is read.
MAX_LINE = MAX_BATCH_PAYLOAD - RECORD_SIZE


# -- shared plumbing ----------------------------------------------------------------------------


def keep_freed_heap() -> None:
    """Stops glibc from handing freed memory back to the OS after every batch.

    With the default 128 KiB trim threshold, each rendered batch of JSON lines was freed, trimmed
    and faulted back in for the next one: ~1 page fault per record, 40% of `replay --format json`'s
    time on this VM (fresh memory is slow here, FIELD-NOTES). Likewise each 1 MiB stdin chunk and
    encoded batch of `produce` was a fresh mmap (116k faults per 1M records; 7k with this).
    Process-wide, so it lives in the CLI, not the library. A no-op where libc is not glibc.
    """
    import ctypes
    import ctypes.util

    with contextlib.suppress(OSError, AttributeError, TypeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(-1, 256 << 20)  # M_TRIM_THRESHOLD
        libc.mallopt(-2, 16 << 20)  # M_TOP_PAD
        libc.mallopt(-3, 64 << 20)  # M_MMAP_THRESHOLD: batch-sized buffers come from the reused heap


def topics_dir(explicit: Path | None) -> Path:
    if explicit is not None:
        return explicit.expanduser()
    env = os.environ.get("RQ_TOPICS_DIR")
    return Path(env).expanduser() if env else user_data_path("rq") / "topics"


# nats-py's protocol returns True from eof_received(), which asyncio's TLS transport warns about on
# every NATS-over-TLS connection; with no handler configured, logging's last resort prints it to
# stderr, a second line beside rq's own. rq's output is rq's: only errors get through.
logging.getLogger("asyncio").setLevel(logging.ERROR)

_CREDENTIALS_HINT = {
    "nats": "set NATS_USER and NATS_PASSWORD (or NATS_USER alone for a token), or user:password@ in the URL",
    "mqtt": "set RQ_MQTT_USERNAME and RQ_MQTT_PASSWORD, or user:password@ in the URL",
}


@contextlib.contextmanager
def library_errors() -> Iterator[None]:
    """The topics library's exceptions -> one line and the documented exit code."""
    try:
        yield
    except TopicError as exc:
        raise cli_error(exc) from None


def cli_error(exc: TopicError) -> CliError:
    """A topics library exception as the one line and exit code rq stops with."""
    if isinstance(exc, SpecError):
        return CliError(str(exc), ExitCode.USAGE)
    if isinstance(exc, SpecFileNotFound):
        return CliError(str(exc), ExitCode.NOT_FOUND, hint="name the file that --save-spec wrote")
    if isinstance(exc, SubjectNotTaken):
        return CliError(str(exc), ExitCode.NOT_FOUND, hint="check the subject after the stream's name")
    if isinstance(exc, TopicNotFound):
        return CliError(str(exc), ExitCode.NOT_FOUND, hint="check the name, or create it with `rq produce`")
    if isinstance(exc, SourceUnreachable):
        # JetStream missing for the account: the line says what to change; the server is running.
        # A connection that was up and then lost (ConnectionLost): the server ran, it dropped it.
        running = isinstance(exc, NoResponders | ConnectionLost)
        return CliError(
            str(exc),
            ExitCode.UNREACHABLE,
            hint=None if running else "is the server running and the URL right?",
        )
    if isinstance(exc, AccessDenied):
        return CliError(
            str(exc),
            ExitCode.AUTH,
            hint=_CREDENTIALS_HINT.get(exc.server) if exc.credentials else None,
        )
    if isinstance(exc, CorruptRecord | DamagedGroup | DigestMismatch):
        return CliError(str(exc), ExitCode.VERIFY)
    if isinstance(exc, Unsupported):
        return CliError(str(exc), ExitCode.UNSUPPORTED)
    if isinstance(exc, RecordTooLarge):
        return CliError(str(exc), ExitCode.USAGE, hint="split it into smaller records")
    if isinstance(exc, WriterBusy):
        return CliError(
            str(exc), ExitCode.FAILURE, hint="one writer per topic: wait for the other `rq produce`"
        )
    if isinstance(exc, CommitNotDurable):
        # stored and read as committed (the done line says so), durability unknown: not exit 0
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        fix = _DISK_FIX.get(exc.errno or 0, "check the file system")
        return CliError(
            str(exc),
            ExitCode.NO_SPACE if full else ExitCode.FAILURE,
            hint=f"{fix}; the group goes on from offset {exc.offset}",
        )
    return CliError(str(exc), ExitCode.FAILURE)


# What to do about a write the file system refused, by errno (rq produce, a commit not synced).
_DISK_FIX = {
    errno.ENOSPC: "free space",
    errno.EDQUOT: "free space within the quota (or raise it)",
    errno.EROFS: "make the file system writable again (one turns read-only after errors: check it)",
    errno.EIO: "check the disk (dmesg, its SMART data)",
}


def _commit(source: Source, group: str, offset: int, committed_to: list[int]) -> None:
    """Stores `offset` for `group` and records it in `committed_to` (the done line's
    `committed`), also when the store is done but not synced (CommitNotDurable, raised on):
    readers see it, so the done line says it, and the run still fails."""
    try:
        source.commit(group, offset)
    except CommitNotDurable:
        committed_to[:] = [offset]
        raise
    committed_to[:] = [offset]


def _ref(topic: str, tdir: Path | None) -> TopicRef:
    return parse_topic(topic, topics_dir(tdir))


def _fields(text: str | None) -> list[FieldPath] | None:
    return parse_fields(text) if text else None


def _parse_headers(items: Sequence[str]) -> Headers:
    out = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise CliError(f"bad --header {item!r}", ExitCode.USAGE, hint="use --header name=value")
        if any("\udc80" <= ch <= "\udcff" for ch in name):  # bytes that are not UTF-8 (surrogateescape)
            raise CliError(f"--header name '{safe_text(name)}' is not UTF-8", ExitCode.USAGE)
        out.append((name, os.fsencode(value)))  # a value is bytes: keep them as given
    return tuple(out)


def _size_option(_ctx: click.Context, _param: click.Parameter, value: str | None) -> int | None:
    """A size option, read as every rq size is (cache.sizes.parse_size, docs/cli.md "Sizes": binary
    units, a number without a unit whole), checked while parsing; positive, as a topic config saved
    with 0 would refuse every later produce."""
    from cache.errors import BadSourceError
    from cache.sizes import parse_size

    if value is None:
        return None
    try:
        size = parse_size(value)
    except BadSourceError as exc:
        raise click.BadParameter(str(exc)) from None
    if size <= 0:
        raise click.BadParameter(f"bad size {value!r}: use a positive size, e.g. 512M, 10G")
    return size


# MQTT's remaining-length field tops out at 268,435,455 bytes; no packet can be larger
MQTT_PACKET_LIMIT = 268_435_455


def _packet_size_option(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """--max-packet-size: a size (as _size_option) no larger than an MQTT packet can be; 256M
    itself, one byte over, is read as that largest packet."""
    size = _size_option(ctx, param, value)
    if size is not None and size > MQTT_PACKET_LIMIT + 1:
        raise click.BadParameter(
            f"{value!r} is over MQTT's largest packet (256M, {MQTT_PACKET_LIMIT:,} bytes)"
        )
    return None if size is None else min(size, MQTT_PACKET_LIMIT)


def _duration_option(_ctx: click.Context, _param: click.Parameter, value: str | None) -> int | None:
    """A duration option in milliseconds, checked while parsing: more than 0."""
    if value is None:
        return None
    try:
        ms = parse_duration_ms(value.strip())
    except SpecError:
        ms = 0
    if ms <= 0:
        raise click.BadParameter(f"bad duration {value!r}: use a positive duration, e.g. 90s, 12h, 7d")
    return ms


idle_timeout_option = click.option(
    "--timeout",
    "idle_timeout",
    type=Seconds(positive=True),
    help="With --follow (an MQTT topic always follows): exit after this many seconds without a record.",
)


def _check_timeout(idle_timeout: float | None, follows: bool) -> None:
    """--timeout ends a follow after a silence; on a read that ends at the topic's end it would do
    nothing, so on the command line it is refused rather than ignored without a word. From the
    environment or the config file it is a default for follows, and a plain read goes on."""
    if idle_timeout is None or follows:
        return
    source = click.get_current_context().get_parameter_source("idle_timeout")
    if source == click.core.ParameterSource.COMMANDLINE:
        raise CliError(
            "--timeout ends a follow after a silence: add -f/--follow, or drop --timeout", ExitCode.USAGE
        )


_KINDS = {"embedded": "embedded", "jetstream": "NATS JetStream", "mqtt": "MQTT"}


def _for_kind(ctx: click.Context, ref: TopicRef, kind: str, **values: Any) -> dict[str, Any]:
    """Options that mean something for one kind of topic only (`--no-retained`, `--max-packet-size`:
    MQTT; `--segment-bytes`: embedded). Typed on the command line for another kind, one is refused,
    not ignored without a word; from RQ_* or the config file it is a default that applies where it
    means something (the variable may be set for every rq run), and is dropped elsewhere."""
    kept = dict(values)
    if ref.kind == kind:
        return kept
    for name, value in values.items():
        if not value:
            continue
        if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE:
            param = next(p for p in ctx.command.params if p.name == name)
            flag = next(o for o in param.opts if o.startswith("--"))
            raise CliError(f"{flag} is for {_KINDS[kind]} topics", ExitCode.USAGE)
        kept[name] = None
    return kept


topics_dir_option = click.option(
    "--topics-dir",
    type=NonEmptyPath(file_okay=False, path_type=Path),
    envvar="RQ_TOPICS_DIR",
    cls=CommandEnvFirst,
    help="Where named embedded topics live (default: the user data dir, e.g. ~/.local/share/rq/topics).",
)


class Writer:
    """Writes rendered bytes (or a rich table) to stdout; flushes only when records should show at once."""

    def __init__(self, fmt: str, fields: list[FieldPath] | None, sep: bytes, live: bool, out: Output):
        self.table = fmt == "table"
        self.renderer: Renderer | None = None if self.table else make_renderer(fmt, fields, sep)
        self.fields = fields
        self.live = live
        self.stream: IO[bytes] = sys.stdout.buffer
        self.out = out
        # With a signal handler that returns (tail, replay --commit), a write interrupted by it returns
        # a short count and BufferedWriter drops the rest (writelines never looks): write in full.
        self.exact = False
        self.headed = False  # a plain table's header line is out (once, not once per batch)
        # `replay --save-spec`: each batch goes out by os.write with the bytes of each record and
        # how many got out counted, so a stop that cuts a stalled write pins exactly the records
        # wholly written (see _write_tracked)
        self.track = False
        self.stops: _Stops | None = None
        self.bounds: list[int] | None = []  # where each record of the batch being written ends
        self.sent = 0  # bytes of that batch written out
        self.unsure = 0  # bytes past `sent` that a write cut by a signal may have written too
        self.finished = True  # the last call wrote its whole batch
        self._kind: str | None = None
        self._poll: Any = None

    @property
    def needs_decode(self) -> bool:
        """Renderers decode values themselves, one at a time; the read loop decodes a batch up
        front only when --where needs the values anyway (then they are handed on, not parsed twice)."""
        return False

    def __call__(self, records: Sequence[Record], decoded: Sequence[Decoded] | None) -> None:
        self.bounds, self.sent, self.unsure, self.finished = [], 0, 0, False
        try:
            if self.track and self.renderer is not None:
                self._write_tracked(self._pieces(records, decoded))
                self.finished = True
                return
            if self.renderer is not None:
                data = self.renderer.render(records, decoded)
                if self.exact:
                    self._write_all(data if isinstance(data, list) else [data])
                elif isinstance(data, list):
                    self.stream.writelines(data)  # no batch-sized join: fresh memory is slow here
                else:
                    self.stream.write(data)
                if self.live:
                    self.stream.flush()
                self.finished = True
                return
            self.bounds = None  # a table: what a cut write got out is not known
            self._table(records, decoded)
            self.finished = True
        except BrokenPipeError:
            _stdout_gone()
            raise ReaderLeft from None
        except OSError as exc:  # closed (`>&-`), full (`> /dev/full`): never a commit
            raise stdout_error(exc) from None

    def _write_all(self, pieces: list[bytes]) -> None:
        write = self.stream.write
        for piece in pieces:
            n = write(piece)
            if n is not None and n < len(piece):
                view = memoryview(piece)[n:]
                while view:
                    view = view[write(view) or 0 :]

    def _pieces(self, records: Sequence[Record], decoded: Sequence[Decoded] | None) -> list[bytes]:
        """The batch rendered as one piece per record (JSON renders so anyway; raw and template
        join theirs, so each record is rendered on its own)."""
        assert self.renderer is not None
        data = self.renderer.render(records, decoded)
        if isinstance(data, list):
            return data
        render = self.renderer.render
        pieces = []
        for i in range(len(records)):
            one = render(records[i : i + 1], decoded[i : i + 1] if decoded is not None else None)
            pieces.append(one if isinstance(one, bytes) else b"".join(one))
        return pieces

    def _stdout_kind(self) -> str:
        if self._kind is None:
            try:
                mode = os.fstat(self.stream.fileno()).st_mode
            except (OSError, ValueError, AttributeError):
                mode = 0
            self._kind = "fifo" if stat.S_ISFIFO(mode) else "file" if stat.S_ISREG(mode) else "other"
            poll = getattr(select, "poll", None)
            if self._kind == "fifo" and poll is not None:
                self._poll = poll()
                self._poll.register(self.stream.fileno(), select.POLLOUT)
        return self._kind

    def _write_tracked(self, pieces: list[bytes]) -> None:
        """Writes the batch with os.write, counting the bytes that got out, so that a stop
        cutting the write (a stalled reader, _Stops.GRACE_S) knows exactly which records were
        wholly written. A signal's stop is not raised inside the write call itself (it would
        lose the count of what that call wrote) but right after it is counted: into a pipe each
        call waits for room first (poll: a stop may come there, nothing of the call written) and
        then writes at most PIPE_BUF bytes, which a pipe takes at once, whole; a regular file
        never stalls. A terminal or a socket may block a write of any size: there the stop cuts
        the call, whose bytes are then `unsure` (the spec pins the records before it and says how
        many more may have gone out)."""
        self.stream.flush()  # nothing of rq's buffer may come after these bytes
        stops = self.stops
        assert stops is not None
        self.bounds = list(itertools.accumulate(len(p) for p in pieces))
        data = b"".join(pieces)
        view = memoryview(data)
        fd = self.stream.fileno()
        kind = self._stdout_kind()
        step = select.PIPE_BUF if kind != "file" else 1 << 20
        defer = kind in ("fifo", "file")
        bounds = self.bounds
        total = len(data)
        while self.sent < total:
            if self._poll is not None:
                self._poll.poll()  # a stop raised here wrote nothing of this call
            end = min(self.sent + step, total)
            if kind == "fifo" and end < total:
                # whole records where they fit: a cut then leaves no half record in the pipe
                i = bisect.bisect_right(bounds, end) - 1
                if i >= 0 and bounds[i] > self.sent:
                    end = bounds[i]
            atomic = kind == "fifo" and end - self.sent <= select.PIPE_BUF
            self.unsure = 0 if atomic else end - self.sent
            stops.in_syscall = defer
            try:
                n = os.write(fd, view[self.sent : end])
            except OSError:
                self.unsure = 0  # refused: nothing of it written (EPIPE, ENOSPC, EBADF)
                stops.in_syscall = False
                raise
            except BaseException:
                stops.in_syscall = False
                raise
            self.sent += n
            self.unsure = 0
            stops.in_syscall = False
            if stops.cut:
                raise stops.cut_now()

    def records_out(self, n: int) -> tuple[int, int]:
        """Of the last call's `n` records: how many were wholly written out, and how many more
        may have been (a write to a terminal or socket that a stop cut)."""
        if self.finished:
            return n, 0
        if self.bounds is None:  # a table
            return 0, n
        whole = bisect.bisect_right(self.bounds, self.sent)
        return whole, bisect.bisect_right(self.bounds, self.sent + self.unsure) - whole

    def mid_record(self) -> bool | None:
        """A cut write left part of a record on stdout (None: not known)."""
        if not self.track or self.bounds is None:
            return None
        if self.unsure:
            return None
        if self.finished:
            return False
        return self.sent > 0 and self.sent not in set(self.bounds)

    def _table(self, records: Sequence[Record], decoded: Sequence[Decoded] | None) -> None:
        from rich.table import Table
        from rich.text import Text

        from topics.paths import project
        from topics.render import decode

        table = Table(show_edge=False, pad_edge=False)
        for col in ("offset", "time", "key", "value"):
            table.add_column(col, overflow="fold" if col == "value" else "ellipsis", no_wrap=col != "value")
        dec = decoded if decoded is not None else [decode(r[4]) for r in records]
        for r, (value, enc) in zip(records, dec, strict=True):
            if self.fields is not None and enc == "json":
                value = project(value, self.fields)
            shown = value if isinstance(value, str) and enc != "json" else orjson.dumps(value).decode()
            if enc == "base64":
                shown = f"(base64) {shown}"
            # UTC, and marked so (it read as local time: a review of time zones)
            when = datetime.fromtimestamp(r[1] / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"
            key = "" if r[2] is None else r[2].decode("utf-8", "replace")
            if ("retained", b"true") in r[3]:  # an MQTT retained message: maybe long stale
                key += " (retained)"
            # Text, not str: rich would read "[link=…]" in a record as markup (a planted hyperlink,
            # or a MarkupError that ends the read).
            table.add_row(str(r[0]), when, Text(safe_text(key)), Text(safe_text(shown[:500])))
        # rich on a terminal; into a pipe, tab-separated lines with one header line in all
        self.out.table(table, header=not self.headed)
        self.headed = True

    def flush(self) -> None:
        try:
            self.stream.flush()
        except BrokenPipeError:
            _stdout_gone()
            raise ReaderLeft from None
        except OSError as exc:
            raise stdout_error(exc) from None

    def close(self) -> None:
        try:
            self.stream.flush()
        except BrokenPipeError:
            _stdout_gone()
        except OSError as exc:
            raise stdout_error(exc) from None


class ReaderLeft(Exception):
    """stdout's reader went away (`rq tail … | head`): stop quietly, commit nothing."""


def _stdout_gone() -> None:
    # Point fd 1 at /dev/null so the interpreter's final flush of buffered output cannot fail.
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def _reader_watch() -> Callable[[], None] | None:
    """`rq tail -f … | head -n 3`: after head exits, a follower would learn it only from its next
    write, which may be hours away. Like GNU `tail -f` (coreutils >= 8.28), poll stdout while idle
    for POLLERR/POLLHUP, which a pipe's write end reports once its reader has gone, and leave as a
    failed write does (quietly, exit 0). Only for a pipe or FIFO: a terminal or a file never says so.

    A stdout that cannot be written at all is told at the first idle check too, not at the first
    record (which may be hours away on an idle topic): closed (`>&-`; rq's stand-in on fd 1 is
    /dev/null opened read-only) or a device that refuses even an empty write (`> /dev/full`). That
    raises StdoutError (exit 1, "cannot write to stdout: …"), as the first write would. A regular
    file on a full disk is still found out by the first write only."""
    try:
        fd = sys.stdout.fileno()
        mode = os.fstat(fd).st_mode
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    except (OSError, ValueError, AttributeError):  # no real stdout (replaced)
        return None
    unwritable: OSError | None = None
    if flags & os.O_ACCMODE == os.O_RDONLY:
        unwritable = OSError(errno.EBADF, os.strerror(errno.EBADF))
    elif stat.S_ISCHR(mode) and not os.isatty(fd):
        try:
            os.write(fd, b"")  # writes nothing; /dev/full refuses it (ENOSPC)
        except OSError as exc:
            unwritable = exc
    if unwritable is not None:
        lost = unwritable

        def refuse() -> None:
            raise stdout_error(lost)

        return refuse
    poll = getattr(select, "poll", None)
    if poll is None or not stat.S_ISFIFO(mode):
        return None
    poller = poll()
    poller.register(fd, 0)  # POLLERR and POLLHUP are reported whatever is asked for
    gone = select.POLLERR | select.POLLHUP

    def check() -> None:
        if any(revents & gone for _, revents in poller.poll(0)):
            _stdout_gone()
            raise ReaderLeft

    return check


def _refuse_feedback(source: TopicRef, target: TopicRef, flag: str) -> None:
    """Following a topic while writing into it reads back its own output: a loop that only a full
    disk ends. (Without --follow the range is fixed first, so copying into the same topic ends.)"""
    if source.kind != target.kind:
        return
    if source.kind == "embedded":
        assert source.path is not None and target.path is not None
        same = _same_directory(source.path, target.path)
    elif source.kind == "jetstream":
        # A publish to the target's subject is read back only if the followed filter takes it:
        # EV/EV.a copied into EV/EV.b (stream EV takes EV.>) is stored in EV, never read again.
        reads_it = not source.subject or subject_matches(source.subject, target.subject or target.stream)
        same = source.stream == target.stream and reads_it and _same_server(source, target)
    else:
        from paho.mqtt.client import topic_matches_sub

        same = topic_matches_sub(source.subject, target.subject) and _same_server(source, target)
    if same:
        raise _feedback(target, flag)


def _feedback(target: TopicRef, flag: str) -> CliError:
    return CliError(
        f"{flag} {safe_text(target.url)} feeds what is being followed back into it",
        ExitCode.USAGE,
        hint=f"give {flag} another topic, or drop --follow",
    )


def _open_followed(ref: TopicRef, target: TopicRef | None, flag: str, **options: Any) -> Source:
    """open_source, then (JetStream into JetStream) the server's own word on a feedback loop: the
    same server reached by another address, or a publish to the target stored in the stream being
    read under another stream's name, which URLs alone cannot tell (see _refuse_feedback)."""
    source = open_source(ref, **options)
    fed_by = getattr(source, "fed_by", None)
    if target is None or target.kind != ref.kind or not callable(fed_by):
        return source
    try:
        fed = fed_by(target)
    except BaseException:
        source.close()
        raise
    if fed:
        source.close()
        raise _feedback(target, flag)
    return source


def _same_directory(a: Path, b: Path) -> bool:
    """One topic directory, however named: a symlink, `..`, a bind mount (same device and inode)."""
    with contextlib.suppress(OSError):
        return os.path.samefile(a, b)
    return os.path.realpath(a) == os.path.realpath(b)  # the target is not made yet


def _addresses(host: str, port: int) -> set[tuple[str, int]]:
    """Where HOST:PORT connects to: `localhost`, `127.0.0.1` and `[::1]` are one server. A name
    that does not resolve stands for itself (connecting to it fails anyway)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return {(host.lower(), port)}
    return {(str(info[4][0]).lower(), port) for info in infos}


def _same_server(a: TopicRef, b: TopicRef) -> bool:
    """The two URLs reach the same server: compared by resolved address, not by spelling (the
    port is already the scheme's default where a URL leaves it out)."""
    if a.port != b.port:
        return False
    if a.host.lower() == b.host.lower():
        return True
    return bool(_addresses(a.host, a.port) & _addresses(b.host, b.port))


_WHEN_EMPTY = {
    "--fields": "name the fields to keep (e.g. image,metadata.source)",
    "--where": "give a filter (e.g. 'metadata.quality_score > 0.9')",
    "--record": "name the topic to record to",
    "--to-topic": "name the topic to copy to",
    "--group": "name the group",
}


def _refuse_empty(**given: str | None) -> None:
    """An empty --fields, --where, --record, --to-topic or --group (`--where "$FILTER"` with FILTER
    unset) was read as not given: a replay of everything where the script meant a part, a capture
    or a copy that never happened, a read with no group. Refused, as an empty --format is."""
    for name, value in given.items():
        if value == "":
            flag = "--" + name.replace("_", "-")
            raise CliError(f"{flag} is empty: {_WHEN_EMPTY[flag]}, or drop {flag}", ExitCode.USAGE)


def _default_format(fmt: str | None) -> str:
    if fmt == "":
        # an empty --format (an unset variable) took the default without a word
        raise CliError("--format is empty: name one (json, raw, table) or give a template", ExitCode.USAGE)
    if fmt is not None:
        return fmt
    return "table" if sys.stdout.isatty() else "json"


class _Copied:
    """What a sink (`--to-topic`, `--record`) stored of the records given to it, and how many it
    took as duplicates without storing them (a JetStream stream's Nats-Msg-Id dedup window)."""

    def __init__(self) -> None:
        self.stored = 0
        self.duplicates = 0
        # Where what the target kept ends, in source offsets, when it failed partway through a
        # batch: the offset of a record it refused (everything before it is stored, nothing after
        # it: the sink removes what it took after it), or of the first record of a split batch
        # whose part the embedded log could not store. `--commit` stores this position.
        self.kept_to: int | None = None
        self.error: OSError | None = None  # the target's own failure (a full disk), not the source's

    def add(self, done: Appended) -> None:
        self.stored += done.stored
        self.duplicates += done.duplicates

    def append(self, sink: Sink, records: Sequence[Record], keep_time: bool) -> None:
        """sink.append; a record the server refused is named by its offset in the source read."""
        try:
            self.add(sink.append([(r[1] if keep_time else None, r[2], r[3], r[4]) for r in records]))
        except PublishRefused as exc:
            before = self.stored + exc.stored_before
            self.add(exc.appended)
            self.kept_to = records[exc.index][0]
            raise TopicError(
                exc.describe(lambda i: f"the record at offset {records[i][0]}", before)
            ) from None
        except PacketTooLarge as exc:
            raise RecordTooLarge(exc.describe(lambda i: f"the record at offset {records[i][0]}")) from None
        except (AppendedPartly, AppendInterrupted) as exc:
            # a batch stored in parts (or a stop after its last part was written): what the
            # target holds counts, and --commit stores the position after it
            self.add(Appended(exc.first, exc.last, exc.stored))
            self.kept_to = records[exc.stored][0] if exc.stored < len(records) else records[-1][0] + 1
            if isinstance(exc.error, OSError):
                self.error = exc.error
            raise exc.error from None
        except OSError as exc:
            self.error = exc
            raise


STAMPED_AHEAD_WARN_MS = 60_000  # beyond the skew of hosts kept in time


def _span(ms: int) -> str:
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000)):
        if ms >= size:
            return f"{ms / size:.1f} {unit}"
    return f"{ms / 1000:.1f} s"


def _warn_stamped_ahead(out: Output, sink: Sink) -> None:
    """An embedded topic whose last record is stamped well ahead of this clock (written under a
    clock that ran ahead) stamps what is produced now at that time: stamps never decrease. Said
    once, so the records are not looked for at their real time in vain."""
    if not isinstance(sink, EmbeddedSink):
        return
    ahead = sink.writer.last_ts - time.time_ns() // 1_000_000
    if ahead > STAMPED_AHEAD_WARN_MS:
        out.warn(
            f"{safe_text(sink.url)}: its last record is stamped {_span(ahead)} ahead of this "
            "clock; records produced now are stamped at that time (stamps never decrease)"
        )


def _emitters(
    writer: Writer | None,
    sink: Sink | None,
    keep_time: bool,
    stops: _Stops | None = None,
    copied: _Copied | None = None,
    counted: Callable[[Sequence[Record]], None] | None = None,
    cut: Callable[[Sequence[Record], int, int], None] | None = None,
) -> Any:
    """keep_time: `tail --record` captures records with their own (arrival) times; `replay
    --to-topic` republishes them as new traffic, stamped when appended. With `stops`, a Ctrl-C or
    SIGTERM waits for the records being written out, which then count as consumed. `copied`
    counts what the sink stored. `counted` is told each batch once it is out, inside the hold: a
    stop that came during the write is raised only after the batch is counted (counted after
    `emit` returned, a signal landing in between left a written batch out of the done line). The
    sink comes first: stdout shows only records the target stored (a full disk under `tail
    --record` printed one batch more than it captured). `cut(records, whole, maybe)`: a write
    stopped partway (a signal, the reader gone, a write error) got `whole` of the records out
    (and perhaps `maybe` more: see Writer.records_out); only with a tracking writer."""
    if writer is not None and stops is not None:
        writer.exact = True
        writer.stops = stops
    if keep_time and isinstance(sink, EmbeddedSink):
        sink.writer.max_ahead_ms = None  # a capture keeps its source's stamps, however far ahead
    tally = copied if copied is not None else _Copied()

    def emit(records: Sequence[Record], decoded: Sequence[Decoded] | None) -> None:
        with stops.held() if stops is not None else contextlib.nullcontext():
            if sink is not None:
                tally.append(sink, records, keep_time)
            if writer is not None:
                if stops is not None:
                    stops.writing = True  # a stop inside the sink's append leaves stdout usable
                writer.bounds, writer.sent, writer.unsure, writer.finished = [], 0, 0, False
                try:
                    writer(records, decoded)
                    if stops is not None:
                        writer.flush()  # out of rq's buffer before the records count as consumed
                        # from here a stop that would cut waits until the batch is counted
                        stops.in_syscall = True
                except BaseException:
                    if stops is not None:
                        stops.in_syscall = False
                        stops.mid_record = writer.mid_record()
                    if cut is not None and writer.track and records:
                        cut(records, *writer.records_out(len(records)))
                    raise
            elif stops is not None:
                stops.in_syscall = True
            if stops is not None:
                stops.emitted_to = max(stops.emitted_to, records[-1][0] + 1)
            if counted is not None and records:
                counted(records)
            if stops is not None:
                stops.in_syscall = False
                if stops.cut:
                    raise stops.cut_now()

    return emit


def _last_n_start(source: Any, n: int, end: int) -> int:
    """Where the last n records before `end` start: the end the read stops at. Counted back
    from a later end (offset_before_end reads its own), records appended in between took
    places among the last n while the read stopped at the earlier end: `tail -n 30` printed 28
    under a producer. A source with sparse offsets (a JetStream subject filter, deleted
    sequences) counts them itself; the embedded log's offsets are dense."""
    before = getattr(source, "offset_before", None)
    if before is not None:
        return int(before(n, end))
    return max(end - n, source.first_offset())


def _aged_out_reporter(out: Output, topic: str, source: Any = None) -> Callable[[int, int], None]:
    """Told when retention deleted records before the reader got to them: said at once (a follow
    may run for days), on stderr and as a --json event; the offsets are never read. Under a
    JetStream subject filter narrower than the stream (`gap_counts_known` false) first..last are
    stream sequences of which any number, maybe none, were on the subject: said so, in words and
    as `"records": null` (absent, the gap is last - first + 1 records)."""
    known = bool(getattr(source, "gap_counts_known", True))
    subject = safe_text(str(getattr(source, "subject", "")))

    def report(first: int, last: int) -> None:
        # JetStream: "deleted" where no limit of the stream can have removed them, only a client
        # (delete_msg of its first messages, a purge); asked when the gap is told
        reason = str(getattr(source, "gap_reason", "retention"))
        event: dict[str, Any] = {"event": "gap", "topic": topic, "first": first, "last": last}
        event["reason"] = reason
        if known:
            one = first == last
            span = f"offset {first}" if one else f"offsets {first}..{last}"
            they, were = ("it", "was") if one else ("they", "were")
            if reason == "retention":
                said = f"{span} aged out (retention) before {they} {were} read"
            else:
                said = f"{span} {were} deleted (a client's delete or a purge; no limit of the stream removed {'it' if one else 'them'}) before {they} {were} read"
        else:
            span = f"stream sequence {first}" if first == last else f"stream sequences {first}..{last}"
            how = "stream limits or a purge" if reason == "retention" else "a client's delete or a purge"
            said = (
                f"{span} were deleted ({how}) before they were read; how many of "
                f"them were on {subject} is not known (maybe none: the stream keeps no record of a "
                "deleted message's subject)"
            )
            event["records"] = None  # how many were on the subject: not known
        try:
            out.warn(said)
            out.emit(event)
        except BrokenPipeError:
            # The reader left while the records before the gap sat in the pipe: as when a
            # record's write finds it gone, they were not consumed (a raw BrokenPipeError let
            # `replay --commit` store the position past them).
            _stdout_gone()
            raise ReaderLeft from None

    return report


class _SkipReporter:
    """--skip-corrupt's skips: a warning each, and under --json one line each (the shape of a
    retention gap's; last is null where the read could not tell where it ends). Said as the read
    goes, once the records read before each skip are out (a follow may run for days); `rest`
    says those a read stopped by Ctrl-C had not told yet."""

    def __init__(self, out: Output, topic: str):
        self.out = out
        self.topic = topic
        self.told = 0

    def __call__(self, first: int, last: int, where: str) -> None:
        try:
            self._say(first, last, where)
        except BrokenPipeError:
            _stdout_gone()
            raise ReaderLeft from None  # as when a record's write finds the reader gone

    def rest(self, res: Result) -> None:
        for first, last, where in res.skipped[self.told :]:
            self._say(first, last, where)

    def _say(self, first: int, last: int, where: str) -> None:
        self.told += 1
        span = f"offset {first}" if last in (first, -1) else f"offsets {first}..{last}"
        self.out.warn(f"skipped corrupt record(s) at {span} ({where})")
        self.out.emit(
            {
                "event": "skipped",
                "topic": self.topic,
                "first": first,
                "last": None if last < 0 else last,
                "reason": "corrupt",
                "where": where,
            }
        )


# -- produce ------------------------------------------------------------------------------------


def _split_lines(stream: IO[bytes], sep: bytes, limit: int = MAX_LINE) -> Iterator[list[bytes]]:
    """Records from delimited input, one list per read: batches follow what the pipe delivers.

    Linear in the input: only the new chunk is searched, and a line spanning reads is kept as a
    list of pieces joined once (re-joining it on every read made a 32 MB line take 8 s). A line
    still unfinished past `limit` bytes can never be stored: refused before any of it is (an
    endless line would otherwise grow memory without bound)."""
    read = getattr(stream, "read1", stream.read)
    pieces: list[bytes] = []  # an unfinished line
    held = 0
    lines = 0
    while True:
        chunk = read(CHUNK)
        if not chunk:
            break
        end = chunk.find(sep)
        if held + (len(chunk) if end < 0 else end) > limit:
            raise RecordTooLarge(
                f"input line {lines + 1} is over {limit} bytes; a record holds at most {limit} bytes"
            )
        if end < 0:
            pieces.append(chunk)
            held += len(chunk)
            continue
        parts = chunk.split(sep)
        if pieces:
            pieces.append(parts[0])
            parts[0] = b"".join(pieces)
            pieces, held = [], 0
        tail = parts.pop()
        if tail:
            pieces, held = [tail], len(tail)
        lines += len(parts)
        for i in range(0, len(parts), BATCH_RECORDS):
            yield parts[i : i + BATCH_RECORDS]
    if pieces:
        yield [b"".join(pieces)]


def _json_record(line: bytes, lineno: int) -> tuple[bytes | None, Headers, bytes]:
    try:
        obj = orjson.loads(line)
        if not isinstance(obj, dict) or "value" not in obj:
            raise ValueError(
                'each line must be an object with a "value" (the shape `rq tail --format json` prints)'
            )
        encoding = obj.get("value_encoding", "json")
        value = (
            json_value_bytes(line, obj["value"])
            if encoding == "json"
            else encode_value(obj["value"], encoding)
        )
        # The common line (no key, no headers) skips the field decoders: this runs per record.
        key = obj.get("key")
        if key is not None:
            key = (
                encode_bytes_field(key, obj.get("key_encoding", "text"))
                if isinstance(key, str)
                else _json_key(key, line, obj.get("key_encoding", "text"))
            )
        headers = obj.get("headers")
        return key, (_json_headers(headers, line) if headers else NO_HEADERS), value
    except (orjson.JSONDecodeError, ValueError, TypeError, AttributeError) as exc:
        raise CliError(f"input line {lineno} is not a record: {exc}", ExitCode.USAGE) from None


class _NumberText(str):
    """A JSON number as written in the line (json's parse_int/parse_float hook): orjson would turn
    1.50 into 1.5, 1e2 into 100.0 and an integer past 64 bits into a float."""


def _is_number(item: object) -> bool:
    return isinstance(item, int | float) and not isinstance(item, bool)


def _json_key(key: object, line: bytes, encoding: object) -> bytes:
    """A key that is not a string. A key is bytes, as in kcat (`-K:` keeps the text before the
    delimiter as typed), so a number is stored as its JSON text exactly as written ("key": 5 -> 5,
    1.50 -> 1.50) and true/false as that word, as header values are. null is no key; an object or
    a list has no one text: refused, saying what a key may be."""
    if encoding != "text":
        raise ValueError(f'"key" with "key_encoding": {json.dumps(encoding)} must be a string')
    if isinstance(key, bool):
        return b"true" if key else b"false"
    if _is_number(key):
        exact = json.loads(line, parse_int=_NumberText, parse_float=_NumberText)["key"]
        return str(exact).encode("utf-8")
    kind = "a list" if isinstance(key, list) else "an object"
    raise ValueError(f'"key" is {kind}: a key is a string, a number or true/false (null or no "key": no key)')


def _json_headers(obj: Any, line: bytes) -> Headers:
    """Header values from a JSON line. Headers are text on every backend (bytes in the embedded
    log, text on NATS), so a value is: a string; {"base64": …} for bytes; a number or true/false,
    stored as its JSON text as written (what `"retries": 3` means; HTTP and NATS headers write
    numbers the same way); a list for a repeated name. null, another object or a nested list has
    no one text it clearly means (null is not "null", nor an absent header): refused, naming it."""
    if not isinstance(obj, dict):
        raise ValueError('"headers" must be an object of name: value')
    items = [(name, item) for name, v in obj.items() for item in (v if isinstance(v, list) else [v])]
    if any(_is_number(item) for _, item in items):
        exact = json.loads(line, parse_int=_NumberText, parse_float=_NumberText)["headers"]
        items = [(name, item) for name, v in exact.items() for item in (v if isinstance(v, list) else [v])]
    headers: list[tuple[str, bytes]] = []
    for name, item in items:
        if not name:
            raise ValueError("a header name is empty")
        if isinstance(item, str):  # a _NumberText too
            headers.append((name, item.encode("utf-8")))
        elif isinstance(item, bool):
            headers.append((name, b"true" if item else b"false"))
        elif isinstance(item, dict) and "base64" in item:
            headers.append((name, encode_bytes_field(item["base64"], "base64") or b""))
        else:
            kind = (
                "null" if item is None else "a list inside a list" if isinstance(item, list) else "an object"
            )
            raise ValueError(
                f"header {name!r} is {kind}: a header value is a string, a number, true/false or "
                '{"base64": "…"} (for an empty value write "")'
            )
    return tuple(headers)


@click.command()
@click.argument("topic")
@click.option("--key", "-k", help="Key for every record.")
@click.option(
    "--header", "-H", "headers", multiple=True, help="Header name=value for every record (repeatable)."
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["lines", "json", "raw"]),
    default="lines",
    show_default=True,
    help="lines: one record per line; json: lines as `rq tail --format json` prints them; raw: all of stdin is one record.",
)
@click.option(
    "-0", "--null", "null_sep", is_flag=True, help="Records are NUL-separated instead of newline-separated."
)
@click.option(
    "--segment-bytes",
    callback=_size_option,
    help="Segment size of the embedded topic (e.g. 128M): set when the topic is made; on an existing one it is stored in topic.json for every later writer (from the active segment on).",
)
@click.option(
    "--retention-bytes",
    callback=_size_option,
    help="Delete the oldest segments above this total size (e.g. 10G); stored in topic.json for every later writer, applied at once.",
)
@click.option(
    "--retention-age",
    callback=_duration_option,
    help="Delete segments whose newest record is older than this (e.g. 7d; more than 0); stored in topic.json for every later writer, applied at once.",
)
@click.option(
    "--max-packet-size",
    envvar="RQ_MQTT_MAX_PACKET_SIZE",
    callback=_packet_size_option,
    help="MQTT: the largest packet rq sends (default 16M; up to 256M); a record over it is refused "
    "before its batch is sent. Env: RQ_MQTT_MAX_PACKET_SIZE.",
)
@topics_dir_option
@output_options
@click.pass_context
def produce(
    ctx: click.Context,
    topic: str,
    key: str | None,
    headers: tuple[str, ...],
    fmt: str,
    null_sep: bool,
    segment_bytes: int | None,
    retention_bytes: int | None,
    retention_age: int | None,
    max_packet_size: int | None,
    topics_dir: Path | None,
) -> None:
    """Append records from stdin to TOPIC (created if needed). Each batch is durable before it is
    acknowledged (with --json, one {"event": "ack"} line per batch).

    \b
    Examples:
      seq 10 | rq produce events
      rq tail events --format json | rq produce copy --format json
      rq produce nats://127.0.0.1:4222/EVENTS/events.raw < samples.jsonl
    """
    out = get_output()
    keep_freed_heap()
    with library_errors():
        ref = _ref(topic, topics_dir)
        segment_bytes, retention_bytes, retention_age = _for_kind(
            ctx,
            ref,
            "embedded",
            segment_bytes=segment_bytes,
            retention_bytes=retention_bytes,
            retention_age=retention_age,
        ).values()
        max_packet_size = _for_kind(ctx, ref, "mqtt", max_packet_size=max_packet_size)["max_packet_size"]
        config: TopicConfig | None = None
        if segment_bytes or retention_bytes or retention_age:
            assert ref.path is not None
            config = TopicConfig.load(ref.path)
            if segment_bytes:
                config.segment_bytes = segment_bytes
            if retention_bytes:
                config.retention_bytes = retention_bytes
            if retention_age:
                config.retention_ms = retention_age
        hdrs = _parse_headers(headers)
        key_b = os.fsencode(key) if key is not None else None  # a key is bytes: kept as given
        started = time.perf_counter()
        batches = _batches(sys.stdin.buffer, fmt, b"\0" if null_sep else b"\n", key_b, hdrs)
        head: list[Sequence[tuple[int | None, bytes | None, Headers, bytes]]] = []
        if ref.kind == "embedded" and ref.path is not None and not ref.path.exists():
            # a new topic is made with its first batch: input refused at its first line leaves no
            # empty topic behind (an existing one is opened first, so a second writer hears at once)
            try:
                head = list(itertools.islice(batches, 1))
            except (Exception, KeyboardInterrupt) as exc:
                _produced(out, ref, _Produced(), started, exc)
                raise
        try:
            packets = {"max_packet_size": max_packet_size} if max_packet_size else {}
            sink = open_sink(ref, config, **packets)
        except OSError as exc:
            full = _write_failed(exc, ref, 0)
            if full is None:
                raise
            raise full from None
        _warn_stamped_ahead(out, sink)
        tally = _Produced()
        acks = True
        # A Ctrl-C or SIGTERM that lands while a batch is appended waits for it (up to
        # _Stops.GRACE_S), so that what the topic stored is counted in the done line: counted
        # after the append returned, a stop landing in between left a stored batch out.
        stops = _Stops()
        stops.settle()  # nothing to commit: no stop waits for anything but the batch
        stops.install()
        try:
            try:
                for batch in itertools.chain(head, batches):
                    with stops.held():
                        done = tally.batch(sink, batch)
                    if acks:
                        try:
                            out.emit(
                                {
                                    "event": "ack",
                                    "first_offset": done.first,
                                    "last_offset": done.last,
                                    "records": done.stored,
                                    "duplicates": done.duplicates,
                                }
                            )
                        except BrokenPipeError:
                            # Nobody reads the acks any more (`rq produce --json | head -1`): that must
                            # not cut stdin short behind an exit 0, so the records still all go in.
                            _stdout_gone()
                            acks = False
            finally:
                sink.close()
        except (Exception, KeyboardInterrupt) as exc:
            # what was acknowledged before the failure is in the log: a script's last line says so
            _produced(out, ref, tally, started, exc)
            full = _write_failed(exc, ref, tally.stored) if isinstance(exc, OSError) else None
            if full is not None:
                raise full from None
            if isinstance(exc, KeyboardInterrupt):
                stops.done()  # the done line is out: a second signal (timeout(1)'s) changes nothing
            raise
        _produced(out, ref, tally, started, None)


class _Produced(_Copied):
    """`rq produce`'s tally: records read from the input and handed to the sink, what it stored
    (first and last offset), and the duplicates it did not store."""

    def __init__(self) -> None:
        super().__init__()
        self.sent = 0  # input records handed to the sink, answered
        self.first: int | None = None
        self.last: int | None = None

    def add(self, done: Appended) -> None:
        super().add(done)
        if done.first is not None:
            self.first = done.first if self.first is None else min(self.first, done.first)
        if done.last is not None:
            self.last = done.last if self.last is None else max(self.last, done.last)

    def batch(self, sink: Sink, records: Sequence[Pending]) -> Appended:
        """One batch into the sink; a record the server refused is named by its place in the input
        (the n-th record read, counting from 1), with what the input stored before it."""
        try:
            done = sink.append(records)
        except PublishRefused as exc:
            before, at = self.stored + exc.stored_before, self.sent
            self.add(exc.appended)
            self.sent += exc.sent
            raise TopicError(exc.describe(lambda i: f"record {at + i + 1} of the input", before)) from None
        except PacketTooLarge as exc:
            at = self.sent
            raise RecordTooLarge(exc.describe(lambda i: f"record {at + i + 1} of the input")) from None
        except (AppendedPartly, AppendInterrupted) as exc:
            # the parts of a split batch before the one that failed (or was stopped by Ctrl-C or
            # SIGTERM) are stored: counted, so the done line and the full-disk line say what the
            # topic holds
            self.add(Appended(exc.first, exc.last, exc.stored))
            self.sent += exc.stored
            if isinstance(exc.error, ConnectionLost):
                # an MQTT broker lost after it acknowledged the first records of the batch: the
                # one line says how many of the input it has (in order), as the --json done line
                acked = (
                    f"the first {self.sent} record(s) of the input were acknowledged, record "
                    f"{self.sent + 1} and later ones not"
                    if self.sent
                    else "no record of the input was acknowledged"
                )
                raise ConnectionLost(f"{exc.error}; {acked}") from None
            raise exc.error from None
        self.add(done)
        self.sent += len(records)
        return done


def _refused_why(exc: OSError, ref: TopicRef) -> str:
    """Why the file system holding `ref` refused a write (an errno of _DISK_FIX), said of it."""
    where = f" holding {safe_text(str(ref.path))}" if ref.path is not None else ""
    return {
        errno.ENOSPC: f"the disk{where} is full",
        errno.EDQUOT: f"the disk quota{where.replace(' holding', ' for')} is used up",
        errno.EROFS: f"the file system{where} is read-only",
        errno.EIO: f"the disk{where} failed (Input/output error)",
    }[exc.errno or 0]


def _write_failed(exc: OSError, ref: TopicRef, acknowledged: int) -> CliError | None:
    """A write the file system refused under `rq produce` (a full disk, a quota used up, a file
    system gone read-only, a failing disk), said with the topic, what it kept and what to do;
    None for other errors. Exit 7 for a disk full or a quota used up, else 1."""
    fix = _DISK_FIX.get(exc.errno or 0)
    if fix is None or (ref.path is None and exc.errno != errno.ENOSPC):
        return None  # (an EIO from a server's socket is no disk's)
    what = _refused_why(exc, ref)
    named = os.fsdecode(exc.filename) if exc.filename else ""
    if named and named != str(ref.path):
        what += f" writing {safe_text(named)}"
    kept = (
        f"the {acknowledged} record(s) acknowledged before it stay readable"
        if acknowledged
        else "nothing was appended"
    )
    if ref.path is None:
        kept += f" in {safe_text(ref.url)}"
    return CliError(
        f"{what}: {kept}",
        ExitCode.NO_SPACE if exc.errno in (errno.ENOSPC, errno.EDQUOT) else ExitCode.FAILURE,
        hint=f"{fix} and run it again: appending resumes where it stopped",
    )


def _produced(
    out: Output, ref: TopicRef, tally: _Produced, started: float, error: BaseException | None
) -> None:
    """`rq produce`'s done line (--json) or its one human line, also after a failure. `records`
    counts the records stored, `duplicates` those the topic answered without storing them."""
    secs = time.perf_counter() - started
    summary: dict[str, Any] = {
        "event": "done",
        "topic": ref.url,
        "records": tally.stored,
        "duplicates": tally.duplicates,
        "first_offset": tally.first,
        "last_offset": tally.last,
        "seconds": round(secs, 3),
        "records_per_s": round(tally.sent / secs) if secs > 0 else None,
    }
    if error is not None:
        summary["error"] = (
            interruption(error)
            if isinstance(error, KeyboardInterrupt)
            else (error.strerror if isinstance(error, OSError) and error.strerror else str(error))
            or type(error).__name__
        )
    with contextlib.suppress(BrokenPipeError):
        out.emit(summary)
    if error is None and not out.json and not out.quiet:
        first, last = tally.first, tally.last
        span = f" (offsets {first}..{last})" if first is not None else ""
        click.echo(
            f"produced {tally.stored} records to {safe_text(ref.url)}{span}" + _duplicates_note(tally),
            err=True,
        )


def _duplicates_note(tally: _Copied) -> str:
    if not tally.duplicates:
        return ""
    return (
        f"; {tally.duplicates} more were duplicates, not stored again (their Nats-Msg-Id was in the "
        "stream's dedup window)"
    )


def _batches(
    stdin: IO[bytes], fmt: str, sep: bytes, key: bytes | None, headers: Headers
) -> Iterator[Sequence[tuple[int | None, bytes | None, Headers, bytes]]]:
    if fmt == "raw":
        data = stdin.read()
        yield [(None, key, headers, data)]
        return
    lineno = 0
    for lines in _split_lines(stdin, sep):
        if fmt == "lines":
            yield [(None, key, headers, v) for v in lines]
            continue
        batch = []
        for line in lines:
            lineno += 1
            if not line.strip():
                continue
            k, h, v = _json_record(line, lineno)
            batch.append((None, k if k is not None else key, h or headers, v))
        if batch:
            yield batch


# -- tail and replay ----------------------------------------------------------------------------

NAMED_FORMATS = ("json", "raw", "table")


def _complete_format(_ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[str]:
    """The named formats for `--format <TAB>` (a template stays free text: none is offered)."""
    return [name for name in NAMED_FORMATS if name.startswith(incomplete)]


def _format_options(func: Any) -> Any:
    func = click.option(
        "--skip-corrupt", is_flag=True, help="Warn about corrupt records and read past them."
    )(func)
    func = click.option(
        "-0", "--null", "null_sep", is_flag=True, help="raw: end each value with NUL, not newline."
    )(func)
    func = click.option(
        "--where",
        help="Only records whose JSON value matches, e.g. 'metadata.quality_score > 0.9 and \"edge-case\" in tags'.",
    )(func)
    func = click.option(
        "--fields", help="Keep only these fields of JSON values, e.g. image,metadata.source."
    )(func)
    func = click.option(
        "--format",
        "fmt",
        shell_complete=_complete_format,
        help="json (default off a terminal), raw, table (default on a terminal), or a template like '{offset} {value.id}'.",
    )(func)
    return func


@click.command()
@click.argument("topic")
@click.option(
    "-n",
    "--lines",
    type=Whole(min=0),
    help="Show the last N records (default 10); on MQTT: stop after N messages.",
)
@click.option("-f", "--follow", is_flag=True, help="Keep printing new records as they arrive.")
@click.option(
    "--record",
    "record_to",
    help="Also append what is shown to this embedded topic (e.g. to replay an MQTT capture).",
)
@click.option(
    "--no-retained",
    is_flag=True,
    help="MQTT: skip retained messages (stale values the broker sends on subscribing), like mosquitto_sub -R.",
)
@click.option(
    "--max-packet-size",
    envvar="RQ_MQTT_MAX_PACKET_SIZE",
    callback=_packet_size_option,
    help="MQTT: the largest packet rq takes from the broker (default 16M; up to 256M); a larger one "
    "ends the tail with an error, before it is buffered. Env: RQ_MQTT_MAX_PACKET_SIZE.",
)
@idle_timeout_option
@_format_options
@topics_dir_option
@output_options
@click.pass_context
def tail(
    ctx: click.Context,
    topic: str,
    lines: int | None,
    follow: bool,
    record_to: str | None,
    no_retained: bool,
    max_packet_size: int | None,
    idle_timeout: float | None,
    fmt: str | None,
    fields: str | None,
    where: str | None,
    null_sep: bool,
    skip_corrupt: bool,
    topics_dir: Path | None,
) -> None:
    """Show the last records of TOPIC; with -f, follow new ones.

    Exits at the end without -f. On an MQTT topic it shows live messages (there is no history),
    after the retained ones the broker sends on subscribing, which carry the header retained: true
    (--no-retained skips them).

    \b
    Examples:
      rq tail events -n 20
      rq tail events -f --where '$key == "user-7"' --format '{offset} {value.action}'
      rq tail mqtt://127.0.0.1:1883/sensors/# --record sensors-capture
    """
    out = get_output()
    keep_freed_heap()
    with library_errors():
        _refuse_empty(fields=fields, where=where, record=record_to)
        ref = _ref(topic, topics_dir)
        fmt = _default_format(fmt)
        writer = Writer(fmt, _fields(fields), b"\0" if null_sep else b"\n", True, out)
        filt = compile_where(where) if where else None
        if record_to:
            check_writable(_ref(record_to, topics_dir))  # before connecting to anything
        no_retained, max_packet_size = _for_kind(
            ctx, ref, "mqtt", no_retained=no_retained, max_packet_size=max_packet_size
        ).values()
        skip_corrupt = bool(_for_kind(ctx, ref, "embedded", skip_corrupt=skip_corrupt)["skip_corrupt"])
        _check_timeout(idle_timeout, follow or ref.kind == "mqtt")
        if record_to and (follow or ref.kind == "mqtt"):
            _refuse_feedback(ref, _ref(record_to, topics_dir), "--record")
        source = _open_followed(
            ref,
            _ref(record_to, topics_dir) if record_to and follow else None,
            "--record",
            idle_timeout=idle_timeout,
            **({"retained": False} if no_retained else {}),
            **({"max_packet_size": max_packet_size} if max_packet_size else {}),
        )
        sink = open_sink(_ref(record_to, topics_dir)) if record_to else None
        res = Result()
        skips = _SkipReporter(out, ref.url)
        shown = [0]  # records written out
        shown_range: list[int | None] = [None, None]  # the offsets of the first and last of them
        stopped: KeyboardInterrupt | None = None
        failed: CliError | None = None  # what stopped the read partway: the done line still comes
        captured = _Copied()  # what --record stored
        # A Ctrl-C or SIGTERM waits for the batch being written out, which then counts in the
        # done line (as replay's, see _Stops); tail commits nothing, so nothing else waits.
        stops = _Stops()
        try:
            stops.install()
            if source.live_only:
                if not out.quiet:
                    click.echo(f"rq: listening on {safe_text(ref.url)} (live; Ctrl-C to stop)", err=True)
                req = Request(start=0, stop=None, follow=True, where=filt, count=lines)
            else:
                n = 10 if lines is None else lines
                end = source.end_offset()
                start = _last_n_start(source, n, end)  # counted back from that end, not a later one
                req = Request(start=start, stop=None if follow else end, follow=follow, where=filt)
            req.skip_corrupt = skip_corrupt
            req.decode_values = writer.needs_decode

            def count_shown(records: Sequence[Record]) -> None:
                shown[0] += len(records)  # counted once written: a Ctrl-C may land inside a write
                if shown_range[0] is None:
                    shown_range[0] = records[0][0]
                shown_range[1] = records[-1][0]

            emit = _emitters(writer, sink, True, stops, captured, count_shown)
            try:
                run(
                    source,
                    req,
                    emit,
                    res,
                    None,
                    _reader_watch(),
                    _aged_out_reporter(out, ref.url, source),
                    skips,
                )
            except ReaderLeft:
                return
            except KeyboardInterrupt as exc:
                stopped = exc  # `tail -f` ends this way: the done line still comes last
            except Exception as exc:
                if record_to and exc is captured.error and _disk_refused(exc, _ref(record_to, topics_dir)):
                    failed = _record_full_disk(exc, _ref(record_to, topics_dir), captured)
                else:
                    failed = _read_failure(exc)
                if failed is None:
                    raise
        finally:
            stops.settle()  # nothing to commit: a signal from now on stops rq as before
            writer.close()
            source.close()
            if sink is not None:
                sink.close()
        skips.rest(res)
        done: dict[str, Any] = {
            "event": "done",
            "topic": ref.url,
            "records": shown[0],
            "first_offset": shown_range[0],  # null when none was written out (as replay's)
            "last_offset": shown_range[1],
            # records written out (or captured) before a stop the read loop had not counted yet
            # (it moves its position after emit): a rerun from the loop's own would repeat them
            "next_offset": max(res.next_offset, stops.emitted_to, captured.kept_to or 0),
        }
        if record_to:
            done["stored"] = captured.stored
        if skip_corrupt:
            done["skipped"] = len(res.skipped)
        if failed is not None:
            with contextlib.suppress(BrokenPipeError):
                out.emit({**done, "error": failed.one_line()})
            _late_line(out, stops, {**done, "error": failed.one_line()})
            raise failed
        if stopped is None:
            out.emit(done)
            return
        with contextlib.suppress(BrokenPipeError):
            out.emit({**done, "error": interruption(stopped)})
        _late_line(out, stops, {**done, "error": interruption(stopped)})
        stops.done()
        raise stopped


@click.command()
@click.argument("topic", required=False)
@click.option(
    "--from",
    "from_spec",
    help="Where to start: N, +N, -N, start, end, @RFC3339, @UNIX_MS, @-1h, or a range A:B. Default: the group's committed offset, else start.",
)
@click.option(
    "--to",
    "to_spec",
    help="Where to stop (exclusive), same grammar. Default: the end (or never, with --follow).",
)
@click.option("--group", "-g", help="Consumer group: start at its committed offset; with --commit, move it.")
@click.option(
    "--commit",
    is_flag=True,
    help="Store the group's new position when done (inspection changes nothing without it).",
)
@click.option(
    "--rate",
    default="max",
    show_default=True,
    help="max, original (the records' own spacing), or a speed-up like 2x.",
)
@click.option("--to-topic", help="Republish the replayed records into this topic (name, path or nats://).")
@click.option(
    "--save-spec",
    type=NonEmptyPath(dir_okay=False, path_type=Path),
    help="Write a spec file that pins this replay (exact offsets, filters, digest).",
)
@click.option(
    "--spec",
    "spec_file",
    type=NonEmptyPath(dir_okay=False, path_type=Path),
    help="Replay exactly what a saved spec pins, and verify its digest.",
)
@click.option("--count", type=Whole(min=0), help="Stop after N records (after --where).")
@click.option(
    "-f", "--follow", is_flag=True, help="Keep reading past the end (until --to, --count or Ctrl-C)."
)
@idle_timeout_option
@_format_options
@topics_dir_option
@output_options
def replay(
    topic: str | None,
    from_spec: str | None,
    to_spec: str | None,
    group: str | None,
    commit: bool,
    rate: str,
    to_topic: str | None,
    save_spec: Path | None,
    spec_file: Path | None,
    count: int | None,
    follow: bool,
    idle_timeout: float | None,
    fmt: str | None,
    fields: str | None,
    where: str | None,
    null_sep: bool,
    skip_corrupt: bool,
    topics_dir: Path | None,
) -> None:
    """Replay an exact range of TOPIC, by offset or by time.

    Time bounds are exact (nothing before --from @t, nothing at or after --to @t) and a bounded
    replay exits when its range is done.

    \b
    Examples:
      rq replay events --from @-1h --to @-30m --format json
      rq replay events --from 1000:2000 --where 'metadata.quality_score > 0.9' --fields image,metadata
      rq replay events --from @2026-11-22T10:00:00Z --count 100 --save-spec run42.json
      rq replay --spec run42.json > same-as-before.jsonl
      rq replay nats://127.0.0.1:4222/EVENTS --group trainer --commit --format raw
    """
    out = get_output()
    keep_freed_heap()
    with library_errors():
        _refuse_empty(fields=fields, where=where, to_topic=to_topic, group=group)
        if spec_file is not None and save_spec is not None:
            # alternatives: a replay by a spec pins nothing new (the spec it verified is the pin)
            raise CliError(
                "--spec and --save-spec are alternatives: a replay by --spec reproduces the spec it "
                "verifies (copy that file to keep another)",
                ExitCode.USAGE,
            )
        saved = ReplaySpec.load(spec_file) if spec_file else None
        if saved is not None:
            clash = [
                n
                for n, v in (
                    ("--from", from_spec),
                    ("--to", to_spec),
                    ("--where", where),
                    ("--count", count),
                    ("--follow", follow or None),
                    ("--group", group),
                )
                if v
            ]
            if clash:
                raise CliError(f"--spec pins the range and filters; drop {', '.join(clash)}", ExitCode.USAGE)
            where = saved.where
            fields = fields if fields is not None else saved.fields
        if topic is None:
            if saved is None:
                raise CliError(
                    "missing TOPIC",
                    ExitCode.USAGE,
                    hint="rq replay TOPIC --from SPEC, or rq replay --spec FILE",
                )
            topic = saved.source
        ref = _ref(topic, topics_dir)
        if ref.kind == "mqtt":
            raise Unsupported(
                "replay needs a topic with history; MQTT has none. Capture it first: "
                f"`rq tail {ref.url} --record NAME`, then `rq replay NAME`"
            )
        # only the embedded log has records to skip: a server's stream never serves a corrupt one
        ctx = click.get_current_context()
        skip_corrupt = bool(_for_kind(ctx, ref, "embedded", skip_corrupt=skip_corrupt)["skip_corrupt"])
        if group:
            check_group_name(group)
        if commit and not group:
            raise CliError("--commit needs --group", ExitCode.USAGE)
        _check_timeout(idle_timeout, follow)
        # Every replay holds a stop during a batch's write and its count (_Stops, as tail and
        # produce do), so its done line counts exactly the records written out; a committing one
        # stores that position, and a follow whose spec is saved records where it stopped.
        stops = _Stops()
        stops.install()
        if save_spec is not None and not save_spec.absolute().parent.is_dir():
            # Found out before replaying (and committing), not after: the spec is the point.
            raise CliError(
                f"cannot write --save-spec {safe_text(str(save_spec))}: its directory does not exist",
                ExitCode.NOT_FOUND,
            )
        if save_spec is not None:
            ReplaySpec.check_savable(save_spec)  # a read-only or forbidden directory, as early
        start_pos, stop_pos = parse_window(from_spec, to_spec)
        pace = Rate.parse(rate)
        filt = compile_where(where) if where else None
        field_paths = _fields(fields)
        show = fmt is not None or to_topic is None
        writer = (
            Writer(
                _default_format(fmt),
                field_paths,
                b"\0" if null_sep else b"\n",
                follow or pace.speed is not None,
                out,
            )
            if show
            else None
        )
        if to_topic:
            check_writable(_ref(to_topic, topics_dir))  # before connecting to anything
        if to_topic and follow:
            _refuse_feedback(ref, _ref(to_topic, topics_dir), "--to-topic")
        source = _open_followed(
            ref,
            _ref(to_topic, topics_dir) if to_topic and follow else None,
            "--to-topic",
            idle_timeout=idle_timeout,
        )
        sink: Sink | None = None
        copied = _Copied()  # what --to-topic stored
        res = Result()
        skips = _SkipReporter(out, ref.url)
        start: int
        stop: int | None
        shown = [0]  # records written out
        # the offsets of the first and last of them: a stop inside a batch's write leaves the
        # read's own tally (res.first_offset/last_offset) naming records never written out
        shown_range: list[int | None] = [None, None]
        reading = False  # the read has begun: an interruption from now on ends with the done line
        stopped: KeyboardInterrupt | None = None
        failed: CliError | None = None  # what stopped the read partway, after it began
        committed_to: list[int] = []  # the offset last stored for the group, if any
        commit_failing = [False]  # a follow's commit failed and has not been stored since
        stopped_at: list[int] = []  # where the read stopped, stored or not: a rerun goes on there
        written: _Written | None = None  # with --save-spec: what was written out, record by record
        try:
            decode_values = writer.needs_decode if writer is not None else False
            if saved is not None:
                # the library checks the range (and a filtered one record by record) before the
                # sink opens or anything is written, and verifies the digest after the read
                req = saved.request(source, rate=pace, skip_corrupt=skip_corrupt, decode_values=decode_values)
            else:
                committed = source.committed(group) if group else None
                window = resolve_window(source, start_pos, stop_pos, follow, committed)
                req = Request(
                    start=window.start,
                    stop=window.stop,
                    follow=follow,
                    time_from=window.time_from,
                    time_to=window.time_to,
                    where=filt,
                    count=count,
                    rate=pace,
                    skip_corrupt=skip_corrupt,
                    decode_values=decode_values,
                    digest=save_spec is not None,
                )
            start, stop = req.start, req.stop
            if save_spec is not None:
                written = _Written(start)
                if writer is not None:
                    writer.track = True
            if to_topic:
                try:
                    sink = open_sink(_ref(to_topic, topics_dir))
                except OSError as exc:
                    copied.error = exc
                    raise
            last_commit = [time.monotonic()]

            def spec_of(r: Result, upto: int | None = None) -> ReplaySpec:
                return ReplaySpec.from_result(
                    source, req, r, upto, from_spec=from_spec, to_spec=to_spec, group=group, fields=fields
                )

            # A bar on stderr only when records are not drawn on the same terminal.
            show_bar = stop is not None and not sys.stdout.isatty()
            bar_cm = out.progress(transfer=False) if show_bar else contextlib.nullcontext(None)

            reader_left = False
            stdout_failed = False

            def save_written(why: str) -> None:
                """A replay that stopped partway saves the spec of what was written out (stdout,
                or the copy without --format), so that FILE never pins another run, and says so."""
                assert written is not None and save_spec is not None
                pinned = written.result(res)
                spec_of(pinned, written.upto).save(save_spec)
                span = (
                    f" (offsets {pinned.first_offset}..{pinned.last_offset})"
                    if pinned.first_offset is not None
                    else ""
                )
                said = (
                    f"{why} after {pinned.emitted} record(s) were written out: the spec "
                    f"{safe_text(str(save_spec))} pins those {pinned.emitted}{span}, range "
                    f"{req.start}..{written.upto}"
                )
                if written.maybe:
                    said += (
                        f"; up to {written.maybe} more may have reached stdout (a write to a "
                        "terminal or socket was cut: its bytes are not known)"
                    )
                out.warn(said)

            try:
                with bar_cm as bar:
                    task = (
                        bar.add_task("replay", total=max(stop - start, 0) if stop else None) if bar else None
                    )

                    def commit_read(r: Result) -> None:
                        """A follow's commit, at most one a second: after a batch, and while it
                        waits for more (a backlog read then a quiet topic stayed uncommitted
                        until the next record or the end: a kill -9 re-read all of it)."""
                        if not (commit and group and follow) or time.monotonic() - last_commit[0] <= 1.0:
                            return
                        if r.next_offset <= (committed_to[0] if committed_to else start):
                            return  # nothing read since
                        try:
                            with stops.storing():
                                _commit(source, group, r.next_offset, committed_to)
                        except SourceUnreachable as exc:
                            # A server that stalls a few seconds ended a healthy follow here (np2:
                            # a 6 s freeze, exit 6), where the read itself rides out ~15 s. The
                            # records stay uncommitted (at least once) and the next commit tries
                            # again; a server really gone ends the read, and the last commit says so.
                            if not commit_failing[0]:
                                out.warn(f"{exc}; the follow goes on and stores it again later")
                            commit_failing[0] = True
                        else:
                            if commit_failing[0]:
                                out.info(f"group {group} stored again at offset {r.next_offset}")
                            commit_failing[0] = False
                        last_commit[0] = time.monotonic()

                    def progress(r: Result) -> None:
                        if written is not None:
                            written.progress(r)
                        if bar is not None and task is not None:
                            bar.update(task, completed=r.next_offset - start)
                        commit_read(r)

                    reader_watch = _reader_watch() if writer is not None else None

                    def watch() -> None:
                        # idle: the follow waits for records (or the pacer sleeps between parts
                        # of a batch: res is still the batch before, all of it written out)
                        if reader_watch is not None:
                            reader_watch()
                        commit_read(res)

                    gaps = _aged_out_reporter(out, ref.url, source)

                    def count_shown(records: Sequence[Record]) -> None:
                        # once written (a Ctrl-C may land inside a write), inside the hold: a
                        # stop held until the write was out (see _Stops) counts them
                        shown[0] += len(records)
                        if shown_range[0] is None:
                            shown_range[0] = records[0][0]
                        shown_range[1] = records[-1][0]
                        if written is not None:
                            written.add(records)

                    def count_cut(records: Sequence[Record], whole: int, maybe: int) -> None:
                        # a write stopped partway (only --save-spec's writer says so): the
                        # records wholly written out count, in the done line as in the spec
                        if written is not None:
                            written.cut(records, whole, maybe)
                            shown[0] = written.emitted
                            shown_range[:] = [written.first_offset, written.last_offset]

                    emit = _emitters(writer, sink, False, stops, copied, count_shown, count_cut)
                    reading = True
                    run(source, req, emit, res, progress, watch, gaps, skips)
            except KeyboardInterrupt as exc:
                if written is not None and save_spec is not None and reading:
                    save_written(interruption(exc))
                raise
            except (ReaderLeft, BrokenPipeError):
                # What the reader never read is not consumed: no commit, exit 0 (like `| head`). A
                # BrokenPipeError is any other write that found it gone (never a commit). A spec
                # pins the records written out: those the reader may have had.
                _stdout_gone()
                reader_left = True
                if written is not None and save_spec is not None:
                    save_written("stdout's reader left")
            except StdoutError:
                # stdout closed or full: what was written may be cut short, so no commit either;
                # the run ends with the stdout line and exit 1
                stdout_failed = True
                raise
            finally:
                # Records written out before a Ctrl-C/SIGTERM count even if the read loop had not
                # moved its position past them yet.
                reached = max(res.next_offset, stops.emitted_to)
                if copied.kept_to is not None:
                    # the records of the batch before the one --to-topic refused or could not
                    # store are stored: a rerun starts there, neither skipping nor copying twice
                    reached = max(reached, copied.kept_to)
                try:
                    if commit and group and reached > start and not (reader_left or stdout_failed):
                        with stops.storing():
                            _commit(source, group, reached, committed_to)
                finally:
                    stops.settle()
                stopped_at[:] = [reached]
            if reader_left:
                return
        except KeyboardInterrupt as exc:
            if not reading:
                raise
            stopped = exc  # a follow ends this way: the done line still comes last
        except Exception as exc:
            if to_topic and exc is copied.error and _disk_refused(exc, _ref(to_topic, topics_dir)):
                assert isinstance(exc, OSError)
                target = _ref(to_topic, topics_dir)
                failed = _copy_full_disk(
                    exc, target, copied, committed_to if commit else None, stopped_at, group
                )
            else:
                failed = _read_failure(exc) if reading else None
            if failed is None:
                raise
            if not reading:
                raise failed from None
            if written is not None and save_spec is not None:
                save_written("the replay failed")
        finally:
            if writer is not None:
                writer.close()
            if sink is not None:
                sink.close()
            source.close()
        skips.rest(res)
        if to_topic:
            _copy_note(out, copied, _ref(to_topic, topics_dir).url)
        if stopped is not None or failed is not None:
            # stopped partway (a signal, a lost server, a full disk): the done line still comes last
            summary = _replay_done(ref, res, start, committed_to if commit and group else None, group)
            summary["records"] = shown[0]
            summary["first_offset"], summary["last_offset"] = shown_range  # null when none were
            if stopped_at:
                # where a rerun goes on (--from N): past records written out or stored in the
                # target before the read loop counted them (a stop inside a split batch's parts),
                # which a rerun from the loop's own position would copy twice
                summary["next_offset"] = max(res.next_offset, stopped_at[0])
            if to_topic:
                summary.update(stored=copied.stored, duplicates=copied.duplicates)
            why: BaseException = failed if failed is not None else stopped  # type: ignore[assignment]
            summary["error"] = failed.one_line() if failed is not None else interruption(why)
            with contextlib.suppress(BrokenPipeError):
                out.emit(summary)
            _late_line(out, stops, summary)
            if stopped is not None:
                stops.done()
            raise why
        if saved is not None:
            saved.verify(res)
        if save_spec is not None:
            spec_of(res).save(save_spec)
        summary = _replay_done(ref, res, start, committed_to if commit and group else None, group)
        if to_topic:
            summary.update(stored=copied.stored, duplicates=copied.duplicates)
        if req.digest:
            summary["digest"] = res.digest
        out.emit(summary)
        if saved is not None and not out.json and not out.quiet:
            click.echo(
                f"rq: replay matches spec {safe_text(str(spec_file))}: {res.emitted} records, {res.digest}",
                err=True,
            )


def _disk_refused(exc: BaseException, target: TopicRef) -> bool:
    """A write the file system refused (full, over quota, read-only, failing): a sink's target
    said with what it kept, as `rq produce` says it (an EIO or EROFS only from a local topic's
    files: a server's socket is no disk)."""
    if not isinstance(exc, OSError) or exc.errno not in _DISK_FIX:
        return False
    return target.path is not None or exc.errno in (errno.ENOSPC, errno.EDQUOT)


def _read_failure(exc: Exception) -> CliError | None:
    """What stopped a read partway, as the line rq exits with (for the done line that still comes
    last); None for an exception that is no error of the read's (a bug: its traceback is kept)."""
    if isinstance(exc, CliError):
        return exc
    if isinstance(exc, TopicError):
        return cli_error(exc)
    if isinstance(exc, OSError):
        from rqcli.main import _from_os_error  # lazy: rqcli.main imports the commands

        return _from_os_error(exc)
    return None


def _full_target(exc: OSError, target: TopicRef, what: str, stored: int) -> str:
    """The start of a refused-write line for a sink: which file system and why, which target,
    what it kept."""
    return f"{_refused_why(exc, target)}: {what} {safe_text(target.url)} stored {stored} record(s) before it"


def _refused_code(exc: OSError) -> ExitCode:
    """Exit 7 for a disk full or a quota used up, else 1 (as `rq produce`)."""
    return ExitCode.NO_SPACE if exc.errno in (errno.ENOSPC, errno.EDQUOT) else ExitCode.FAILURE


def _record_full_disk(exc: OSError, target: TopicRef, captured: _Copied) -> CliError:
    """`tail --record` onto a full disk: as replay --to-topic's line (the records shown are the
    records it stored: the sink is written first)."""
    return CliError(
        _full_target(exc, target, "--record to", captured.stored) + "; stdout shows exactly those",
        _refused_code(exc),
        hint=f"{_DISK_FIX[exc.errno or 0]} and run it again (a new capture appends after them)",
    )


def _copy_full_disk(
    exc: OSError,
    target: TopicRef,
    copied: _Copied,
    committed_to: list[int] | None,
    stopped_at: list[int],
    group: str | None,
) -> CliError:
    """`replay --to-topic` onto an embedded log on a full disk: which target, how many records
    it stored, where the group stands, and how to go on (as `rq produce` names its topic)."""
    line = _full_target(exc, target, "the copy to", copied.stored)
    fix = _DISK_FIX[exc.errno or 0]
    if committed_to:
        line += f"; group {group} is committed at offset {committed_to[0]}, where the copy stopped"
        hint = f"{fix} and re-run to continue: the group goes on from there, nothing twice"
    elif committed_to is not None:
        line += f"; nothing was committed for group {group}"
        hint = f"{fix} and re-run to continue: the group starts where it stood"
    else:
        at = stopped_at[0] if stopped_at else None
        line += "; nothing was committed (no --group --commit)"
        hint = f"{fix} and re-run to continue" + (
            f" with --from {at}, where the copy stopped" if at is not None else ""
        )
    return CliError(line, _refused_code(exc), hint=hint)


def _copy_note(out: Output, copied: _Copied, to_topic: str) -> None:
    """A copy whose target took records as duplicates stored fewer than it read: said, not only
    in --json's done line (`stored`, `duplicates`)."""
    if copied.duplicates:
        out.warn(
            f"{copied.duplicates} of the {copied.stored + copied.duplicates} records copied to "
            f"{safe_text(to_topic)} were not stored: duplicates (their Nats-Msg-Id was in the "
            "stream's dedup window)"
        )


LATE_LINE_WAIT_S = 0.5


def _late_line(out: Output, stops: _Stops, obj: dict[str, Any]) -> None:
    """The --json done line after a stop cut a stalled write (and pointed fd 1 at /dev/null, so
    that nothing else blocks on it): written to the stdout it was only if that takes it at once —
    a pipe with room for the whole line within LATE_LINE_WAIT_S (a line of at most PIPE_BUF
    bytes, which a pipe takes whole or not at all), or a regular file; never a blocking write.
    It starts with a line break unless the cut is known to have left no part of a record."""
    fd = stops.kept_stdout
    if fd is None:
        return
    stops.kept_stdout = None
    try:
        if not out.json:
            return
        line = json_line(obj)
        if stops.mid_record is not False:
            line = b"\n" + line
        mode = os.fstat(fd).st_mode
        if stat.S_ISFIFO(mode):
            poll = getattr(select, "poll", None)
            if poll is None or len(line) > select.PIPE_BUF:
                return
            poller = poll()
            poller.register(fd, select.POLLOUT)
            ready = poller.poll(int(LATE_LINE_WAIT_S * 1000))
            if not any(ev & select.POLLOUT and not ev & (select.POLLERR | select.POLLHUP) for _, ev in ready):
                return
        elif not stat.S_ISREG(mode):
            return  # a terminal or socket may block: the line is lost there
        os.write(fd, line)
    except (OSError, KeyboardInterrupt):
        pass  # a reader gone, a full disk, a further signal: the line is lost, nothing else
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)


class _Written:
    """`replay --save-spec`: what stdout (or the --to-topic copy) got, record by record, for the
    spec of a replay that stopped partway (a signal, the reader gone, an error): count, digest and
    the offsets, and `upto`, where that spec's range ends: past the last record written out and
    what the filters dropped after it, never past a record that was not written out."""

    def __init__(self, start: int):
        import xxhash

        self.hasher = xxhash.xxh3_128()
        self.emitted = 0
        self.first_offset: int | None = None
        self.last_offset: int | None = None
        self.upto = start
        self.maybe = 0  # records past those that a cut write to a terminal or socket may have sent

    def add(self, records: Sequence[Record]) -> None:
        from topics.pipeline import digest_records

        if not records:
            return
        digest_records(self.hasher, records)
        self.emitted += len(records)
        if self.first_offset is None:
            self.first_offset = records[0][0]
        self.last_offset = records[-1][0]
        self.upto = max(self.upto, records[-1][0] + 1)

    def cut(self, records: Sequence[Record], whole: int, maybe: int) -> None:
        self.add(records[:whole])
        if whole < len(records):
            self.upto = records[whole][0]  # the first record not written out
        self.maybe = maybe

    def progress(self, res: Result) -> None:
        # the batch is all out: the range runs on to where the read is (records the filters dropped)
        if self.emitted == res.emitted:
            self.upto = max(self.upto, res.next_offset)

    def result(self, res: Result) -> Result:
        return Result(
            emitted=self.emitted,
            first_offset=self.first_offset,
            last_offset=self.last_offset,
            next_offset=self.upto,
            gaps=[g for g in res.gaps if g[0] < self.upto],
            hasher=self.hasher.copy(),
        )


def _replay_done(
    ref: TopicRef, res: Result, start: int, committed_to: list[int] | None, group: str | None
) -> dict[str, Any]:
    """`rq replay`'s done line; committed_to: the offset stored for the group, with --commit."""
    summary: dict[str, Any] = {
        "event": "done",
        "topic": ref.url,
        "records": res.emitted,
        "scanned": res.scanned,
        "start": start,
        "next_offset": res.next_offset,
        "first_offset": res.first_offset,
        "last_offset": res.last_offset,
    }
    if res.skip_corrupt:
        summary["skipped"] = len(res.skipped)  # skip lines, each an offset or a range
    if committed_to is not None:
        # null when nothing was read, so nothing was stored (e.g. --from past the end)
        summary["committed"] = {"group": group, "offset": committed_to[0]} if committed_to else None
    return summary


class _Stops:
    """Ctrl-C, SIGTERM and SIGHUP for `replay --commit` (and, holding only their writes, for a
    plain `replay` and `tail`, whose done lines count what stdout got, and `produce`, whose counts
    what the topic stored: GRACE_S and the held write below apply to them alike). Service managers (systemd, Kubernetes) stop a
    consumer with SIGTERM: it must store its position then, as on Ctrl-C, not die with up to a
    second of reads uncommitted. A signal that lands while records are being written out is held
    until they are out (then they count as consumed, not re-read or, worse, half-shown and
    skipped), but for GRACE_S at most: a write blocked on a stalled pipe (`| sleep`, a reader
    that stopped reading) is cut short, the records before it are committed and rq exits 130.
    A second signal does not wait. A reader that leaves while a stop is pending (the same Ctrl-C
    reached the whole pipeline) is that stop, exit 130, never a quiet exit 0.

    A commit is never cut short by a signal: one that comes during a commit waits for it, and once
    a stop is under way further signals are held until its commit is done (GNU `timeout` signals
    rq and then its whole process group: the second SIGTERM came while the first one's commit was
    starting, which was then skipped, or cut in half inside nats-py's event loop). Bounded: a
    commit still running COMMIT_GRACE_S after such a signal is stopped inside."""

    GRACE_S = 2.0
    COMMIT_GRACE_S = 10.0
    # A signal this soon after the first is the same stop delivered twice (GNU `timeout` signals
    # rq and then its process group), not a person's second Ctrl-C: it does not cut the write.
    SAME_STOP_S = 0.2

    def __init__(self) -> None:
        self.busy = False
        self.writing = False  # records of the batch held are being written to stdout
        self.pending = False
        self.emitted_to = 0  # offset after the last record written out
        self.signum: int = signal.SIGINT  # the first stop signal: SIGTERM says so in the last line
        self.stopping = False  # a stop was raised: its commit (in replay's finally) is to come
        self.settled = False  # that commit is done (or there was none)
        self.committing = False
        self.held_more = False  # a signal came while a stop was under way
        self.timed = False  # the commit's grace timer runs
        self.first_at = 0.0  # when a stop held for a write came
        self.stop_at = 0.0  # when the first stop signal came
        # Writer._write_tracked: inside a write call whose count must not be lost, a stop due
        # now is only marked (`cut`) and raised by the writer once the call's bytes are counted
        self.in_syscall = False
        self.cut = False
        self.cut_at = 0.0
        # stdout as it was before a cut write pointed fd 1 at /dev/null: the done line may still
        # go there (late_line); mid_record: the cut left part of a record there (None: not known)
        self.kept_stdout: int | None = None
        self.mid_record: bool | None = None

    def _cut(self) -> None:
        """A stop that cuts the write under way: raised now, or right after the write call that
        is running has been counted (see Writer._write_tracked). A call that does not return
        (a pipe another writer filled) is cut anyway after GRACE_S, its bytes then not known."""
        if not self.in_syscall:
            raise self._stop()
        now = time.monotonic()
        if not self.cut:
            self.cut, self.cut_at = True, now
        elif now - self.cut_at >= self.GRACE_S:
            raise self._stop()
        signal.setitimer(signal.ITIMER_REAL, 0.25)  # back here if the call does not return

    def cut_now(self) -> KeyboardInterrupt:
        self.cut = False
        return self._stop()

    def _stop(self) -> KeyboardInterrupt:
        self.stopping = True
        if self.signum == signal.SIGINT:
            return KeyboardInterrupt()
        return Terminated(signal.Signals(self.signum).name)  # SIGTERM or SIGHUP: the last line says which

    def install(self) -> None:
        # SIGHUP (the terminal or ssh session gone) too: main's handler raised it inside a held
        # write, which then pointed stdout at /dev/null, and the done line was lost. A signal the
        # parent left ignored stays ignored (`nohup`; SIGINT in a background job of a script), as
        # main's own handlers leave it.
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            if signal.getsignal(signum) is not signal.SIG_IGN:
                signal.signal(signum, self._interrupt)
        signal.signal(signal.SIGALRM, self._overdue)

    def _interrupt(self, signum: int, _frame: object) -> None:
        now = time.monotonic()
        if self.stopping and self.settled and now - self.stop_at < self.SAME_STOP_S:
            # the stop's commit is done and rq is closing what it read to write the done line:
            # the same stop sent twice (timeout(1)) must not cut that short
            return
        if not self.stop_at:
            self.stop_at = now
        if self.committing or (self.stopping and not self.settled):
            if self.stopping:
                self.held_more = True
            elif not self.pending:  # the first stop, during a commit of the follow's: after it
                self.signum = signum
                self.pending = True
            if self.committing:
                self._time_commit()
            return
        if not self.pending:
            self.signum = signum
        if self.busy and not self.pending:
            self.pending = True
            self.first_at = time.monotonic()
            signal.setitimer(signal.ITIMER_REAL, self.GRACE_S)
            return
        if self.busy and time.monotonic() - self.first_at < self.SAME_STOP_S:
            return  # the same stop sent twice (timeout(1): to rq, then to its group), not a second
        self._cut()

    def _overdue(self, _signum: int, _frame: object) -> None:
        if self.busy and self.pending:
            self._cut()  # the write did not finish in time: stop inside it
        elif self.committing and self.timed:
            raise self._stop()  # the commit did not finish in time: stop inside it

    def _time_commit(self) -> None:
        if not self.timed:
            self.timed = True
            signal.setitimer(signal.ITIMER_REAL, self.COMMIT_GRACE_S)

    @contextlib.contextmanager
    def storing(self) -> Iterator[None]:
        """A commit: a stop signal that comes during it waits for it (see the class)."""
        self.committing = True
        if self.held_more:
            self._time_commit()
        try:
            yield
        finally:
            self.committing = False
            if self.timed:
                self.timed = False
                signal.setitimer(signal.ITIMER_REAL, 0)
        if self.pending and not self.stopping:
            self.pending = False
            raise self._stop()

    def done(self) -> None:
        """The stop is complete (committed, done line out): rq only exits now. A signal from here
        on is ignored: Python gives the default action back to its handled signals as it shuts
        down, and a second SIGTERM then (GNU `timeout`'s to the process group, a few ms after the
        first) killed rq at the very end: exit 143 for a stop that had done everything."""
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)

    def settle(self) -> None:
        """A stop's commit is done: a signal from now on stops rq as before (a done line stuck on a
        stalled stdout can still be interrupted)."""
        self.settled = True

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        self.busy = True
        try:
            yield
        except ReaderLeft:
            if self.pending:
                raise self._stop() from None
            raise
        except KeyboardInterrupt:
            # Stopped inside a write (a stalled pipe): what is still buffered can never get out,
            # and flushing it at exit would block again. Stopped inside the sink's append (a slow
            # disk), stdout has nothing of the batch and still takes the done line. The stdout
            # it was is kept for that line (late_line: only if it takes it at once).
            if self.writing:
                if self.kept_stdout is None:
                    with contextlib.suppress(OSError, ValueError):
                        self.kept_stdout = os.dup(sys.stdout.fileno())
                _stdout_gone()
            raise
        finally:
            self.busy = False
            self.writing = False
            self.in_syscall = False
            self.cut = False
            signal.setitimer(signal.ITIMER_REAL, 0)
        if self.pending:
            self.pending = False
            raise self._stop()


# -- offsets ------------------------------------------------------------------------------------


def _complete_reset(ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[str]:
    """`rq offsets <TAB>` offers the `reset` subcommand (its first word; TOPIC is free text)."""
    if ctx.params.get("words"):
        return []
    return ["reset"] if "reset".startswith(incomplete) else []


@click.command(context_settings={"ignore_unknown_options": False})
@click.argument(
    "words", nargs=-1, required=True, metavar="TOPIC | reset TOPIC", shell_complete=_complete_reset
)
@click.option("--group", "-g", help="Only this consumer group (required for reset).")
@click.option("--to", "to_spec", help="reset: the new position (SPEC: N, +N, -N, start, end, @time).")
@click.option("--dry-run", is_flag=True, help="reset: show what would change, change nothing.")
@topics_dir_option
@output_options
def offsets(
    words: tuple[str, ...], group: str | None, to_spec: str | None, dry_run: bool, topics_dir: Path | None
) -> None:
    """Show first/last offsets and each group's lag, or `reset` a group.

    Committed = the next offset the group reads; lag = end - committed.

    \b
    Examples:
      rq offsets events
      rq offsets events --group trainer --json
      rq offsets reset events --group trainer --to @-1h --dry-run
    """
    out = get_output()
    with library_errors():
        _refuse_empty(group=group)
        if words[0] == "reset" and len(words) == 2:
            _reset(words[1], group, to_spec, dry_run, topics_dir, out)
            return
        if words == ("reset",):
            # `reset` first is always the subcommand: taken as a topic name it said "topic …/reset
            # does not exist" (exit 3) to someone who only forgot the TOPIC
            raise CliError(
                "rq offsets reset: TOPIC is missing",
                ExitCode.USAGE,
                hint="rq offsets reset TOPIC --group G --to SPEC (a topic named reset: give its full path)",
            )
        if len(words) != 1:
            raise CliError(
                "expected TOPIC, or reset TOPIC",
                ExitCode.USAGE,
                hint="rq offsets events / rq offsets reset events --group g --to start",
            )
        if to_spec or dry_run:
            raise CliError("--to and --dry-run belong to `rq offsets reset`", ExitCode.USAGE)
        ref = _ref(words[0], topics_dir)
        if ref.kind == "mqtt":
            raise Unsupported("MQTT topics have no offsets (live only)")
        source = open_source(ref)
        try:
            check_end = getattr(source, "check_end", None)  # embedded: lost data at the end
            if callable(check_end):
                check_end()
            first, end = source.first_offset(), source.end_offset()
            # On a subject-filtered stream other subjects' messages sit between first and end.
            last = source.offset_before_end(1) if end > first else None
            counted = getattr(source, "record_count", None)
            records = counted() if callable(counted) else end - first
            find_lost = getattr(source, "lost", None)  # embedded: a segment cut short in the middle
            lost = find_lost() if callable(find_lost) else []
            records -= sum(b - a + 1 for a, b, _ in lost)
            names = [check_group_name(group)] if group else source.groups()
            rows: list[dict[str, object]] = []
            damaged: list[str] = []
            server_lag = getattr(source, "group_lag", None)  # JetStream: from consumer info
            for name in names:
                try:
                    committed = source.committed(name)
                except SpecError as exc:
                    if group:
                        raise
                    # another application's durable consumer whose name no rq group can have
                    # ("a$b", "é-x"): one such made the whole listing fail
                    out.warn(f"skipped consumer {safe_text(repr(name))}: not an rq group name ({exc})")
                    continue
                except DamagedGroup as exc:
                    # one bad group file hid the topic and every good group: shown, marked, exit 5
                    damaged.append(str(exc))
                    rows.append({"group": name, "committed": None, "lag": None, "damaged": str(exc)})
                    continue
                if committed is None and group:
                    # named, and no such group: a row with committed `-` read as a group that exists
                    # and has read nothing (a typo looked like a new consumer). Kafka's
                    # kafka-consumer-groups says "Consumer group 'X' does not exist." Listing every
                    # group is unchanged; `rq offsets reset` and `replay --commit` create one.
                    raise CliError(
                        f"consumer group {safe_text(group)} does not exist on {safe_text(ref.url)}: "
                        "it has never committed an offset",
                        ExitCode.NOT_FOUND,
                        hint=f"list the groups with `rq offsets {safe_text(words[0])}`",
                    )
                if committed is None:
                    # a group at the start: every record of the topic (on JetStream `end - first`
                    # counted other subjects' messages and deleted sequences)
                    lag = records if callable(server_lag) else end - first
                elif callable(server_lag):
                    lag = server_lag(name)
                else:
                    lag = end - max(committed, first)
                rows.append({"group": name, "committed": committed, "lag": max(lag, 0)})
        finally:
            source.close()
        info = {
            "topic": ref.url,
            "first": first,
            "last": last,
            "end": end,
            "records": records,
        }
        if lost:
            info["lost"] = [[a, b] for a, b, _ in lost]
        if out.json:
            out.emit({**info, "groups": rows})
            _say_damaged(out, damaged, lost)
            _say_lost(out, lost)
            return
        shown_last = "-" if last is None else last  # (an empty topic)
        gone = f" ({sum(b - a + 1 for a, b, _ in lost)} lost)" if lost else ""
        # what `rq offsets` was asked for: printed under -q too, as the group table is
        out.result(f"{safe_text(ref.url)}: first {first}, last {shown_last}, {records} records{gone}")
        if rows:
            from rich.table import Table  # (only for a table: ~15 ms)
            from rich.text import Text

            table = Table(show_edge=False)
            for col in ("group", "committed", "lag"):
                table.add_column(col)
            for row in rows:
                shown = "-" if row["committed"] is None else str(row["committed"])  # nothing committed yet
                lag_shown = str(row["lag"])
                if "damaged" in row:
                    shown, lag_shown = "damaged", "-"
                table.add_row(Text(safe_text(str(row["group"]))), shown, lag_shown)
            out.table(table)  # rich on a terminal, tab-separated lines into a pipe
        _say_damaged(out, damaged, lost)
        _say_lost(out, lost)


def _say_damaged(out: Output, damaged: list[str], lost: list[tuple[int, int, str]]) -> None:
    """Groups whose committed offset is damaged: shown in the listing, then exit 5 (after `lost`
    when the log has lost ranges too)."""
    if not damaged:
        return
    for why in damaged if lost else damaged[:-1]:
        out.warn(why)
    if not lost:
        more = f" ({len(damaged)} groups damaged in all)" if len(damaged) > 1 else ""
        raise CliError(f"{damaged[-1]}{more}", ExitCode.VERIFY)


def _say_lost(out: Output, lost: list[tuple[int, int, str]]) -> None:
    """Offsets lost in the middle of the log: shown after what is readable, then exit 5."""
    if not lost:
        return
    for _, _, why in lost[:-1]:
        out.warn(why)
    more = f" ({len(lost)} ranges lost in all)" if len(lost) > 1 else ""
    raise CliError(
        f"{lost[-1][2]}{more}",
        ExitCode.VERIFY,
        hint="copy what is readable with `rq replay TOPIC --skip-corrupt --to-topic NEW`",
    )


def _reset(
    topic: str, group: str | None, to_spec: str | None, dry_run: bool, tdir: Path | None, out: Output
) -> None:
    if not group or not to_spec:
        raise CliError(
            "reset needs --group and --to", ExitCode.USAGE, hint="rq offsets reset TOPIC --group G --to start"
        )
    check_group_name(group)
    pos = parse_position(to_spec)
    ref = _ref(topic, tdir)
    if ref.kind == "mqtt":
        raise Unsupported("MQTT topics have no offsets (live only)")
    source = open_source(ref)
    damaged: str | None = None  # why the group's committed offset could not be read
    unsynced: CommitNotDurable | None = None
    try:
        try:
            before = source.committed(group)
        except DamagedGroup as exc:  # what reset is for: write a good one over it
            damaged = str(exc)
            out.warn(
                f"group {safe_text(group)} has a damaged committed offset; "
                + ("reset would replace it" if dry_run else "replacing it")
            )
            before = None
        first, end = source.first_offset(), source.end_offset()
        asked = resolve(pos, source)
        target = min(asked, end)
        clamped = _reset_clamp(pos, source, asked, first, end)
        if not dry_run:
            try:
                source.commit(group, target)
            except CommitNotDurable as exc:
                unsynced = exc  # moved: readers see `target` (the answer says so), then exit non-zero
    finally:
        source.close()
    answer: dict[str, Any] = {
        "topic": ref.url,
        "group": group,
        "before": before,
        "after": target,
        "dry_run": dry_run,
        "clamped": clamped,
    }
    if damaged is not None:
        answer["damaged"] = damaged  # only then: the key set scripts compare stays as it was
    out.emit(answer)
    verb = "would move" if dry_run else "moved"
    # a new group shows "-" (as `rq offsets` does); a damaged one says so, never "-" (which read
    # as a group that had never committed)
    shown = "-" if before is None else before
    if damaged is not None:
        shown = "a damaged offset"
    note = f" (clamped to the {clamped} {target})" if clamped else ""
    # a dry run's line is its whole answer (-q keeps it); after a real move it is a report, like
    # the counts -q drops elsewhere
    say = out.result if dry_run else out.info
    say(f"{verb} group {safe_text(group)} on {safe_text(ref.url)} from {shown} to {target}{note}")
    if unsynced is not None:
        raise cli_error(unsynced)


def _reset_clamp(pos: Position, source: Any, asked: int, first: int, end: int) -> str | None:
    """Whether a reset's target lay outside the topic and was moved inside it ("start", "end"),
    said, never done silently: an absolute offset below the first one or past the end, and alike
    a relative one (`-N` with fewer than N records there, `+N` past the end), which resolve()
    clamps on its own."""
    if asked > end:
        return "end"
    if pos.kind == "offset":
        return "start" if pos.value < first else None
    if pos.kind == "start+":
        return "end" if first + pos.value > end else None
    if pos.kind == "end-":
        counted = getattr(source, "record_count", None)  # JetStream: on the subject, if one
        records = int(counted()) if callable(counted) else end - first
        return "start" if pos.value > records else None
    return None


for _command, _name in ((produce, "produce"), (tail, "tail"), (replay, "replay"), (offsets, "offsets")):
    documented_env_names(_command, _name)
