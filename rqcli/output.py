"""How rq talks to people and scripts: JSON lines, quiet mode, progress bars only on a terminal."""

from __future__ import annotations

import contextlib
import errno
import functools
import itertools
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

import click

from rqcli.errors import CliError
from rqcli.exitcodes import ExitCode

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID
    from rich.table import Table

F = TypeVar("F", bound=Callable[..., Any])


@functools.cache
def _controls() -> dict[int, str]:
    """C0, DEL and C1 controls (0x9b is a one-byte CSI on some terminals); bidi overrides, which can
    make a name read backwards; lone surrogates (a file name that is not UTF-8, via surrogateescape),
    which would stop the output with UnicodeEncodeError: each shown as an escape instead. Built on
    first use: its ~2,100 entries cost every start ~1.5 ms, and most runs print no name."""
    return (
        {c: f"\\x{c:02x}" for c in [*range(32), *range(0x7F, 0xA0)]}
        | {c: f"\\u{c:04x}" for c in [*range(0x202A, 0x202F), *range(0x2066, 0x206A)]}
        | {c: f"\\x{c - 0xDC00:02x}" for c in range(0xDC80, 0xDD00)}
        | {c: f"\\u{c:04x}" for c in [*range(0xD800, 0xDC80), *range(0xDD00, 0xE000)]}
    )


def json_line(obj: dict[str, Any]) -> bytes:
    """`obj` as one line of JSON in UTF-8. A string holding undecodable bytes (a path or topic name
    that is not UTF-8, kept by Python as lone surrogates) is written with those bytes as \\xNN, as
    `rq cache` writes such paths: orjson refuses them (TypeError), which ended a command exit 1
    after it had stored, committed or cached what it was asked to."""
    import orjson  # --json only

    try:
        return orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_APPEND_NEWLINE)
    except orjson.JSONEncodeError:
        return orjson.dumps(
            _undecodable_escaped(obj), option=orjson.OPT_NON_STR_KEYS | orjson.OPT_APPEND_NEWLINE
        )


def _undecodable_escaped(value: Any) -> Any:
    if isinstance(value, str):
        try:
            raw = value.encode("utf-8", "surrogateescape")  # the bytes the name had
        except UnicodeEncodeError:  # a surrogate no byte became
            return value.encode("utf-8", "backslashreplace").decode()
        return raw.decode("utf-8", "backslashreplace")
    if isinstance(value, dict):
        return {_undecodable_escaped(k): _undecodable_escaped(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_undecodable_escaped(v) for v in value]
    return value


def _write_bytes(stream: Any, data: bytes) -> None:
    """Bytes to a text stream's binary buffer (after what the stream holds), else decoded."""
    buffer = getattr(stream, "buffer", None)
    if buffer is None:  # a StringIO (tests, click's runner)
        stream.write(data.decode("utf-8", "backslashreplace"))
        return
    stream.flush()
    buffer.write(data)


def safe_text(text: str) -> str:
    """A name from the network or a bucket, made safe to print: control characters escaped."""
    return text.translate(_controls())


@functools.cache
def _console_class() -> type[Console]:
    """rich is imported only when something is drawn: it costs every rq command ~35 ms at start-up,
    and scripts and training jobs (no terminal, --json, -q) never draw anything."""
    from rich.console import Console

    class _Console(Console):
        """Rich exits 1 when the reader of its output leaves; for rq, `| head` is success on every
        command, so hand the BrokenPipeError to the `rq` group, which ends the command with exit 0."""

        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))

    return _Console


# Commands whose job is a side effect: when the reader of their stdout leaves (`rq preload … | head
# -n1`, `| grep -m1 failed`), they finish the work and exit with its code. Stopping with exit 0 there
# told a `pipefail` script that a preload cut short had succeeded. Listings and reads (`ls`, `tail`,
# `replay`, `doctor`) stop at once with exit 0 instead: their output is the job, and `| head` is done.
KEEP_GOING_WITHOUT_STDOUT = frozenset(
    {
        "rq preload",
        "rq send",
        "rq recv",
        "rq produce",
        "rq cache verify",
        "rq cache evict",
        "rq cache pin",
        "rq cache unpin",
        "rq cache clear",
        "rq cache orphans",
    }
)


def _point_at_devnull(stream: Any) -> None:
    """Later writes to this stream's descriptor go nowhere, instead of failing again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, stream.fileno())
    finally:
        os.close(devnull)


class StdoutError(CliError):
    """stdout cannot be written (closed with `>&-`, a full disk, an I/O error): one line naming
    stdout, exit 1. Not exit 7, which says the cache's disk is full, and not silence: a command whose
    output went nowhere must not exit 0 (`rq replay -g G --commit >&-` moved the group past records
    nobody got)."""


def stdout_error(exc: OSError, stream: Any = None) -> StdoutError:
    """The error for a failed write to stdout; stdout then points at /dev/null, so that nothing
    written later (a --json summary, the interpreter's last flush) fails again."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        _point_at_devnull(sys.stdout if stream is None else stream)
    return StdoutError(f"cannot write to stdout: {exc.strerror or exc}", ExitCode.FAILURE)


def _keeps_going() -> bool:
    ctx = click.get_current_context(silent=True)
    return ctx is not None and ctx.command_path in KEEP_GOING_WITHOUT_STDOUT


@dataclass
class Output:
    """The terminal side of one rq invocation. Commands get it with `get_output()`."""

    json: bool = False
    quiet: bool = False
    verbose: int = 0
    stdout: Any = field(default_factory=lambda: sys.stdout)
    stderr: Any = field(default_factory=lambda: sys.stderr)

    @property
    def interactive(self) -> bool:
        """True when a person watches stderr: progress bars are drawn only then."""
        if self.json or self.quiet or os.environ.get("CI"):
            return False
        return bool(getattr(self.stderr, "isatty", lambda: False)())

    stdout_lost: bool = False  # the reader of stdout left and the command went on without it
    # whether the command goes on without stdout: set by get_output() on the main thread, because
    # click's context is per thread and rq recv emits from its channel threads
    keep_going: bool | None = None
    # a command that goes on without stdout found it unwritable: rq main() ends the run with it
    stdout_failed: StdoutError | None = None

    def _to_stdout(self, text: str | bytes) -> None:
        if self.stdout_lost:
            return
        try:
            if isinstance(text, bytes):
                _write_bytes(self.stdout, text)
            else:
                self.stdout.write(text)
            self.stdout.flush()
        except BrokenPipeError:
            if not (self.keep_going if self.keep_going is not None else _keeps_going()):
                raise  # the `rq` group ends the command with exit 0
            self.stdout_lost = True
            _point_at_devnull(self.stdout)
        except OSError as exc:  # closed (`>&-`), a full disk (`> /dev/full`), EIO
            err = stdout_error(exc, self.stdout)
            if not (self.keep_going if self.keep_going is not None else _keeps_going()):
                raise err from None
            # the work goes on (as for a reader gone) and the run ends with exit 1 and this line
            self.stdout_lost = True
            self.stdout_failed = err

    def _to_stderr(self, text: str) -> None:
        try:
            click.echo(text, file=self.stderr)
        except BrokenPipeError:  # `2>&1 | head`: a lost warning must not stop the work
            _point_at_devnull(self.stderr)

    def emit(self, obj: dict[str, Any]) -> None:
        """One JSON object on one line of stdout (only in --json mode), as UTF-8 bytes whatever
        stdout's text encoding (PYTHONIOENCODING=ascii made every line with a `—` or an `é` an
        "unexpected UnicodeEncodeError", exit 1, after the work was done)."""
        if self.json:
            self._to_stdout(json_line(obj))

    def result(self, text: str) -> None:
        """A line of what the command was asked for (a listing, a path, an entry's fields) on
        stdout: silent under --json, which carries the same data, but not under --quiet, which
        drops chatter, not answers (`rq -q cache ls | wc -l` must count entries)."""
        if not self.json:
            self._to_stdout(text + "\n")

    def info(self, text: str) -> None:
        """A human line on stdout; silent under --json and --quiet."""
        if not (self.json or self.quiet):
            self._to_stdout(text + "\n")

    def warn(self, text: str) -> None:
        """A warning on stderr; silent under --quiet."""
        if not self.quiet:
            self._to_stderr(f"rq: warning: {text}")

    def debug(self, text: str) -> None:
        if self.verbose:
            self._to_stderr(f"rq: {text}")

    def console(self) -> Console:
        return _console_class()(
            file=self.stdout, highlight=False, soft_wrap=False, color_system=_color_system()
        )

    def table(self, table: Table, header: bool = True) -> None:
        """A table on stdout: drawn by rich (box characters, colours, wrapped to the width) when
        stdout is a terminal; into a pipe or a file, plain lines for scripts (`| cut -f2`, `|
        grep`, `| sort`): a header line of the column names (unless `header` is false), then one
        line per row, cells separated by one tab, nothing cut, folded or padded, no title, no
        box characters and no ANSI codes. A tab or newline inside a cell is shown escaped (\\x09,
        \\x0a: see safe_text), so a row is always one line of exactly one cell per column."""
        if _isatty(self.stdout):
            self.console().print(table)
            return
        from rich.text import Text

        def plain(cell: object) -> str:
            if isinstance(cell, Text):
                text = cell.plain
            elif isinstance(cell, str):
                text = Text.from_markup(cell).plain  # the markup a terminal would style
            else:
                text = str(cell)
            return safe_text(text)

        columns = table.columns
        lines = ["\t".join(safe_text(str(c.header)) for c in columns)] if header else []
        lines += [
            "\t".join(plain(cell) for cell in row) for row in zip(*(c.cells for c in columns), strict=True)
        ]
        if lines:
            self._to_stdout("".join(line + "\n" for line in lines))

    @contextlib.contextmanager
    def progress(self, transfer: bool = True) -> Iterator[Progress | Heartbeat | None]:
        """A rich progress display on stderr when interactive; off a terminal (a CI log, a pipe,
        journald) a Heartbeat, which writes one plain line per task at most every HEARTBEAT_EVERY
        seconds; None under --json and --quiet (callers skip updates)."""
        if self.json or self.quiet:
            yield None
            return
        if not self.interactive:
            beat = Heartbeat(self, transfer)
            try:
                yield beat
            finally:
                beat.stop()
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TaskProgressColumn,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        columns: list[Any] = [TextColumn("{task.description}"), BarColumn(), TaskProgressColumn()]
        if transfer:
            columns += [DownloadColumn(), TransferSpeedColumn()]
        columns.append(TimeRemainingColumn())
        console = Console(file=self.stderr, color_system=_color_system())
        with Progress(*columns, console=console, transient=False) as bar:
            yield bar


# How often, at most, a Heartbeat writes its line: a run shorter than this writes none.
HEARTBEAT_EVERY = 10.0


@dataclass
class _Beat:
    description: str
    total: float | None
    completed: float = 0.0
    shown: float = 0.0  # `completed` at the last line (or at the start)
    moved_at: float = field(default_factory=time.monotonic)  # when `completed` last changed
    seen_at: float = field(default_factory=time.monotonic)  # when `shown` was taken (its rate's start)
    stalled_said: float = 0.0  # how long it had been still at its last "no progress" line


class Heartbeat:
    """What `Output.progress()` gives off a terminal: the part of rich's Progress the commands use
    (add_task, update, advance, remove_task), drawn as one plain line per task on stderr at most
    every HEARTBEAT_EVERY seconds, from a thread of its own, so that a log tells a slow run from a
    hung one: `rq: sending: 1.2 GiB of 4.0 GiB (30%), 410 MB/s, ~7 s left`, or counts for a
    bar that is not a transfer (`rq: replay: 1200 of 5000 (24%), 300/s, ~13 s left`). A task that
    stopped moving is said to be still (`no progress for 20 s`) at growing intervals (10, 20, 40 s,
    …), not every beat; a finished one no more. Nothing for a run shorter than one interval."""

    def __init__(self, out: Output, transfer: bool = True) -> None:
        self._out, self._transfer = out, transfer
        self._tasks: dict[TaskID, _Beat] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._last = time.monotonic()
        self._thread: threading.Thread | None = None
        self._ids = itertools.count()  # (never len(tasks): an id removed must not come back)

    def add_task(
        self, description: str, total: float | None = None, completed: float = 0, **_: Any
    ) -> TaskID:
        with self._lock:
            task = cast("TaskID", next(self._ids))
            self._tasks[task] = _Beat(description, total, completed, completed)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="rq-heartbeat", daemon=True)
                self._thread.start()
        return task

    def update(
        self,
        task_id: TaskID,
        *,
        total: float | None = None,
        completed: float | None = None,
        advance: float | None = None,
        description: str | None = None,
        **_: Any,
    ) -> None:
        with self._lock:
            beat = self._tasks.get(task_id)
            if beat is None:
                return
            if total is not None:
                beat.total = total
            if description is not None:
                beat.description = description
            was = beat.completed
            if completed is not None:
                beat.completed = completed
            if advance is not None:
                beat.completed += advance
            if beat.completed != was:
                beat.moved_at = time.monotonic()
                beat.stalled_said = 0.0

    def advance(self, task_id: TaskID, advance: float = 1) -> None:
        self.update(task_id, advance=advance)

    def remove_task(self, task_id: TaskID) -> None:
        with self._lock:
            self._tasks.pop(task_id, None)

    def refresh(self) -> None:
        pass

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)

    def _run(self) -> None:
        while not self._stopped.wait(max(0.01, HEARTBEAT_EVERY - (time.monotonic() - self._last))):
            if time.monotonic() - self._last < HEARTBEAT_EVERY:
                continue
            for line in self.lines():
                self._out._to_stderr(f"rq: {line}")

    def lines(self) -> list[str]:
        """The lines due now (and the interval starts again)."""
        now = time.monotonic()
        with self._lock:
            self._last = now
            said = []
            for beat in self._tasks.values():
                # over the time since this task's own last line (or its start), not the beat's: a
                # transfer that arrived late in a receiver's interval is not averaged with idle time
                line = self._line(beat, max(now - beat.seen_at, 1e-9), now)
                beat.shown, beat.seen_at = beat.completed, now
                if line is not None:
                    said.append(line)
        return said

    def _line(self, beat: _Beat, elapsed: float, now: float) -> str | None:
        total = beat.total
        if total is not None and beat.completed >= total:
            return None  # finished: its command says so
        text = f"{beat.description}: {self._amount(beat.completed)}"
        if total:
            text += f" of {self._amount(total)} ({int(100 * beat.completed / total)}%)"
        rate = (beat.completed - beat.shown) / elapsed
        if rate <= 0:
            still = now - beat.moved_at
            # said again only once it has been still twice as long as at the last such line
            if still < HEARTBEAT_EVERY or still < 2 * beat.stalled_said:
                return None
            beat.stalled_said = still
            return f"{text}, no progress for {still:.0f} s"
        text += f", {rate / 1e6:.0f} MB/s" if self._transfer else f", {rate:.0f}/s"
        if total:
            text += f", ~{(total - beat.completed) / rate:.0f} s left"
        return text

    def _amount(self, n: float) -> str:
        if not self._transfer:
            return f"{n:.0f}"
        from cache.sizes import format_size

        return format_size(n)


# rq's own packages: their loggers (transfer.quic's) speak under -v; everything else (aioquic,
# qh3, botocore, urllib3, nats) only under -vv, and then only from INFO for the ones whose DEBUG
# dumps whole signed requests (credentials, session tokens) — see _SECRETS too
OWN_LOGGERS = ("rqcli", "cache", "transfer", "topics")
REQUEST_DUMPERS = ("botocore", "boto3", "s3transfer", "urllib3", "awscrt")
# what a log line may still carry that must not reach a CI log: signed headers, a presigned URL's
# signature and token, a password in a URL's userinfo
_SECRETS = re.compile(
    r"(?i)((?:authorization|(?:x-amz-)?security-token|(?:x-amz-)?signature|(?:x-amz-)?credential|"
    r"aws_secret_access_key|aws_session_token|password)['\"]?\s*[:=]\s*b?['\"]?)([^'\"&,\s}]+)"
    r"|(://[^/\s:@]+:)([^@\s/]+)(@)"
)


def redact(text: str) -> str:
    """`text` with secret values replaced by ***."""
    return _SECRETS.sub(lambda m: f"{m[1]}***" if m[1] else f"{m[3]}***{m[5]}", text)


class _StderrLog(logging.Handler):
    """Log records as rq's one-line stderr messages (`rq: debug: transfer.quic: …`), for -v. The
    libraries only log; rqcli alone installs this handler, and never writes a log line to stdout."""

    def __init__(self, out: Output) -> None:
        super().__init__(logging.DEBUG)
        self.out = out

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
            if record.exc_info and record.exc_info[1] is not None and str(record.exc_info[1]) not in text:
                text += f" ({type(record.exc_info[1]).__name__}: {record.exc_info[1]})"
            level = record.levelname.lower()
            self.out._to_stderr(f"rq: {level}: {record.name}: {safe_text(redact(text))}")
        except Exception:
            self.handleError(record)


_handler: _StderrLog | None = None


def show_logs(out: Output) -> None:
    """Puts the library loggers' messages on stderr for -v (rq's own from INFO; with -vv rq's
    from DEBUG and every other library's too, from DEBUG); nothing without -v."""
    global _handler
    if out.verbose <= 0 or out.quiet:  # (-q: only errors on stderr, -v or not)
        return
    root = logging.getLogger()
    if _handler is None:
        _handler = _StderrLog(out)
        root.addHandler(_handler)
    _handler.out = out
    many = out.verbose >= 2
    # under -v other libraries say only their errors: their warnings are theirs to tune (qh3
    # warns "Native peer close" on every healthy end of a connection)
    root.setLevel(logging.DEBUG if many else logging.ERROR)
    for name in OWN_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if many else logging.INFO)
    for name in REQUEST_DUMPERS:
        logging.getLogger(name).setLevel(logging.INFO if many else logging.NOTSET)


def hide_logs() -> None:
    """Undoes show_logs (each run in one process starts without it: tests, a host program)."""
    global _handler
    if _handler is not None:
        logging.getLogger().removeHandler(_handler)
        _handler = None
        logging.getLogger().setLevel(logging.WARNING)
        for name in (*OWN_LOGGERS, *REQUEST_DUMPERS):
            logging.getLogger(name).setLevel(logging.NOTSET)


def _color_system() -> Literal["auto"] | None:
    """ "auto", or None (no SGR code at all: no colour, no bold, no dim) when NO_COLOR is set and
    not empty (https://no-color.org). rich's own no_color drops colours only and keeps bold and dim,
    which many terminals draw in a bright or faint colour ("bold is bright"); cargo, ripgrep and uv
    (termcolor, anstream) write no style at all under NO_COLOR, and so does rq. The table is still
    drawn: box characters, columns and wrapping are layout, not colour."""
    return None if os.environ.get("NO_COLOR", "") != "" else "auto"


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no real stream (closed, replaced)
        return False


def get_output() -> Output:
    """The Output of the running command (created by the `rq` group)."""
    ctx = click.get_current_context()
    out = ctx.find_object(Output)
    if out is None:
        out = ctx.ensure_object(Output)
    if out.keep_going is None:
        out.keep_going = ctx.command_path in KEEP_GOING_WITHOUT_STDOUT
    return out


def _set_json(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        ctx.ensure_object(Output).json = True


def _set_quiet(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        ctx.ensure_object(Output).quiet = True


def _set_verbose(ctx: click.Context, _param: click.Parameter, value: int) -> None:
    if value:
        out = ctx.ensure_object(Output)
        out.verbose = max(out.verbose, value)
        show_logs(out)


def output_options(func: F) -> F:
    """Adds --json/-q/-v to a subcommand, so `rq doctor --json` works as well as `rq --json doctor`."""
    func = click.option(
        "-v",
        "--verbose",
        count=True,
        expose_value=False,
        callback=_set_verbose,
        is_eager=True,
        help="More detail on stderr; tracebacks on errors.",
    )(func)
    func = click.option(
        "-q",
        "--quiet",
        is_flag=True,
        expose_value=False,
        callback=_set_quiet,
        is_eager=True,
        help="Only errors on stderr.",
    )(func)
    func = click.option(
        "--json",
        "json_",
        is_flag=True,
        expose_value=False,
        callback=_set_json,
        is_eager=True,
        help="Machine output: one JSON object per line.",
    )(func)
    return func
