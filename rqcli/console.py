"""The `rq` console script's entry point.

The collector is off while rq imports: imports build long-lived objects only, and the full passes
the collector made over them cost ~5 ms of every start (measured: the preload command's imports,
111 vs 116 ms). It comes back on once the command's own module is loaded (rqcli.main), or, for
`rq preload`, after the command has imported the cache and frozen what it imported.

SIGINT, SIGTERM and SIGHUP are held from here on: rq's imports take ~100 ms, and a signal in them
killed the process without a word (SIGTERM) or with a Python traceback (SIGINT), where a script reading
`rq send --json` is promised a summary. rqcli.main answers a held signal before the command runs.
A signal the parent left ignored (`nohup`, a background job of a non-interactive shell, whose SIGINT
is ignored) stays ignored, as it does for any well-behaved Unix program.
"""

import contextlib
import gc
import os
import signal
import sys
import threading

gc.disable()

_held: list[int] = []


def _hold(signum: int, _frame: object) -> None:
    _held.append(signum)


def held_signals() -> list[int]:
    """The signals that arrived while rq was starting, and the normal handling back: SIGINT as
    KeyboardInterrupt (rqcli.main sets SIGTERM's and SIGHUP's own)."""
    if signal.getsignal(signal.SIGINT) is _hold:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) is _hold:
            signal.signal(signum, signal.SIG_DFL)
    held, _held[:] = list(_held), []
    return held


def _standard_streams_open() -> None:
    """A closed stdin, stdout or stderr (`2>&-` in a script) gets a descriptor before rq opens
    anything: otherwise the next file rq opens takes that descriptor, and the interpreter has set
    the stream to None, which click.echo replaces with stdout — warnings landed in `rq cache cat`'s
    data, and the first `.isatty()` or `.write()` was an AttributeError.

    stdin and stderr become /dev/null (a lost warning must not stop the work). stdout becomes
    /dev/null opened read-only: it holds descriptor 1, and every write to it still fails with
    EBADF, as it would closed, so a command fails on its first write to stdout ("cannot write to
    stdout: Bad file descriptor", exit 1) as `cat >&-` does, instead of dropping its output and
    exiting 0 (`rq replay -g G --commit >&-` moved the group past records nobody got). A command
    that writes nothing to stdout (`rq -q preload`, `rq produce` without --json) runs as before."""
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        try:
            os.fstat(fd)
        except OSError:
            got = os.open(os.devnull, os.O_RDONLY if fd == 1 else os.O_RDWR)
            if got != fd:  # a lower descriptor was closed too and took it: it is handled in turn
                os.dup2(got, fd)
                os.close(got)
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, mode, closefd=False, encoding="utf-8", errors="backslashreplace"))  # noqa: SIM115 - lives as long as rq


_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_BLOCKED_ENV = "RQ_UTF8_BLOCKED_SIGNALS"  # signals blocked across the re-exec, unblocked once held


def _launched_as_rq() -> bool:
    """Whether this process is the `rq` console script or `python -m rqcli`, which a re-exec runs
    again as it was: a program calling main() itself, or a script read from stdin, is not."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name in ("rqcli.__main__", "rqcli"):
        return True
    return os.path.basename(sys.argv[0]) == "rq" and os.path.isfile(sys.argv[0])


def _utf8_mode() -> None:
    """rq runs in Python's UTF-8 mode (PEP 540) whatever the locale: file names, arguments and the
    environment are read as UTF-8 (bytes that are not: kept as surrogates and refused or escaped
    where a name must be UTF-8), never in the locale's encoding. Under a Latin-1 locale, or C with
    PYTHONUTF8=0, `rq send` renamed `café` to `cafÃ©` on the receiver, a receiver crashed placing an
    `é`, and preload indexed keys another process could not find. Python turns the mode on by itself
    in the C and POSIX locales; elsewhere rq starts itself again with `-X utf8` (same PID, before
    any import; children inherit PYTHONUTF8=1). Text on stdout and stderr keeps the locale's
    encoding (PYTHONIOENCODING, unless set): a Latin-1 terminal still shows `é`. SIGINT, SIGTERM
    and SIGHUP are blocked across the exec (the mask survives it) and let through once the new
    process holds them, so the re-exec adds no window in which a signal kills rq unanswered."""
    if sys.flags.utf8_mode:
        return
    import codecs

    if codecs.lookup(sys.getfilesystemencoding()).name == "utf-8" or not _launched_as_rq():
        return
    os.environ["PYTHONUTF8"] = "1"
    if "PYTHONIOENCODING" not in os.environ:
        encoding = getattr(sys.stdout, "encoding", None) or sys.getfilesystemencoding()
        os.environ["PYTHONIOENCODING"] = f"{encoding}:backslashreplace"
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    os.environ[_BLOCKED_ENV] = ",".join(str(int(s)) for s in _SIGNALS if s not in blocked)
    try:
        os.execv(sys.executable, [sys.executable, "-X", "utf8", *sys.orig_argv[1:]])
    except OSError:  # cannot: go on in the locale's encoding, as before
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        os.environ.pop(_BLOCKED_ENV, None)


def _unblock_after_exec() -> None:
    """Lets through the signals _utf8_mode blocked across its exec (now held: see main)."""
    names = os.environ.pop(_BLOCKED_ENV, None)
    if names:
        with contextlib.suppress(ValueError):
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.Signals(int(n)) for n in names.split(",")])


def _stdout_never_fails_on_a_character() -> None:
    """Text rq prints (names, `—`) that stdout's encoding cannot take (PYTHONIOENCODING=ascii)
    is escaped, as stderr's already is, instead of ending the command with exit 1."""
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None:
        with contextlib.suppress(ValueError, OSError):
            reconfigure(errors="backslashreplace")


def main() -> None:
    _utf8_mode()
    _standard_streams_open()
    _stdout_never_fails_on_a_character()
    if threading.current_thread() is threading.main_thread():  # (signal.signal's own rule)
        for signum in _SIGNALS:
            if signal.getsignal(signum) is not signal.SIG_IGN:
                signal.signal(signum, _hold)
    _unblock_after_exec()
    from rqcli.main import main as run

    run()
