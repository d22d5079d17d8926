"""The one exception rqcli commands raise to stop with a message and an exit code."""

from __future__ import annotations

from rqcli.exitcodes import ExitCode


class CliError(Exception):
    """Stops the command: `message` goes to stderr as one line, `code` becomes the exit status.

    `hint` says what to do about it; it is appended to the same line.
    """

    def __init__(self, message: str, code: ExitCode = ExitCode.FAILURE, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.hint = hint

    def one_line(self) -> str:
        from rqcli.output import safe_text  # lazy: this module stays import-light

        text = self.message if not self.hint else f"{self.message} — {self.hint}"
        # One line, whatever the library put in it, and no terminal escapes from names in it.
        return safe_text(" ".join(text.split()))


def open_files_limit() -> str:
    """This process's soft limit on open files, as a hint names it."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return "unlimited" if soft == resource.RLIM_INFINITY else str(soft)


class Terminated(KeyboardInterrupt):
    """SIGTERM (a CI job cancelled, a pod stopped) or SIGHUP (the ssh session or terminal gone),
    raised in the main thread so that it stops a command the way Ctrl-C does: cleanups run, a
    partial summary still ends --json, exit 130."""

    def __init__(self, signame: str = "SIGTERM") -> None:
        super().__init__(signame)
        self.signame = signame


def interruption(exc: BaseException) -> str:
    """What stopped the command, for a summary's `error` and the last stderr line."""
    return f"stopped by {exc.signame}" if isinstance(exc, Terminated) else "interrupted"
