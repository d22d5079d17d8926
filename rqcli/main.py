"""The `rq` command group: global options, lazy subcommands, and the one place errors become exit codes."""

from __future__ import annotations

import contextlib
import errno
import functools
import gc
import importlib
import importlib.util
import os
import re
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from rqcli import config, teardown
from rqcli.config import check_config, load_config
from rqcli.errors import CliError, Terminated, interruption
from rqcli.exitcodes import EXIT_CODE_HELP, ExitCode
from rqcli.output import Output, hide_logs, show_logs
from rqcli.params import CommandEnvFirst, NonEmptyPath, documented_env_names_everywhere

# name -> (module, attribute, one-line example). Modules load only when their command runs, so
# `rq tail` does not pay for boto3 and `rq preload` does not pay for aioquic. A module that is not
# there yet is simply not listed.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "preload": ("rqcli.commands.preload", "preload", "rq preload s3://bucket/train/ --tier ram"),
    "cache": ("rqcli.commands.cache", "cache", "rq cache du"),
    "send": ("rqcli.commands.transfer", "send", "rq send ckpt/ rq://10.0.0.2:7420"),
    "recv": ("rqcli.commands.transfer", "recv", "rq recv /data/ckpt --listen 0.0.0.0:7420"),
    "produce": ("rqcli.commands.topics", "produce", "seq 10 | rq produce events"),
    "tail": ("rqcli.commands.topics", "tail", "rq tail events -n 20 -f"),
    "replay": ("rqcli.commands.topics", "replay", "rq replay events --from @-1h --to end"),
    "offsets": ("rqcli.commands.topics", "offsets", "rq offsets events --group trainer"),
    "doctor": ("rqcli.commands.doctor", "doctor", "rq doctor --endpoint-url http://127.0.0.1:8333"),
}

# Each command's line in `rq --help` (its get_short_help_str(70)), so that the help does not import
# every command's module (and cache, topics, transfer with them): ~0.1 CPU-s a run.
# tests/cli/test_li_lazy_commands.py checks it against the commands themselves. A command missing
# here is imported for its line, as before.
SHORT_HELP: dict[str, str] = {
    "preload": "Preload S3 prefixes or directories into the local cache.",
    "cache": "Inspect and manage the local cache (see docs/cache.md for the layout).",
    "send": "Send files and directories to `rq recv`; re-run the same command to...",
    "recv": "Receive checkpoints into DEST_DIR; prints the line to paste on the...",
    "produce": "Append records from stdin to TOPIC (created if needed).",
    "tail": "Show the last records of TOPIC; with -f, follow new ones.",
    "replay": "Replay an exact range of TOPIC, by offset or by time.",
    "offsets": "Show first/last offsets and each group's lag, or `reset` a group.",
    "doctor": "Check S3, NATS, QUIC, UDP buffers, RDMA and cache space.",
}

# commands that turn the collector back on themselves, once their lazy imports are done
OWN_GC = {"preload"}


# A command whose --json output always ends with a summary (docs/cli.md) names it with this
# attribute: a function of the one-line error that returns the summary of a run that never started.
# main() prints it under --json when Click refused the arguments or a signal came before the command
# ran; once the command's own code runs, printing it is the command's job.
NOT_STARTED = "not_started_summary"


@dataclass
class _Run:
    """What main() needs to know about the invocation going on, after Click has let go of it."""

    out: Output | None = None  # the group's Output: --json before or after the command name
    entered: bool = False  # the command's own code began
    ctx: click.Context | None = None  # the running command's context (its parameters' sources)


_run = _Run()
_marked: set[click.Command] = set()


def _mark_entry(command: click.Command) -> None:
    """Has the command's callback note that it began (if it has a summary) and its context (an
    error it raises about a value names where the value came from), once per command."""
    if isinstance(command, click.Group):  # (its subcommands' own; a group's callback runs first)
        for sub in command.commands.values():
            _mark_entry(sub)
        return
    callback = command.callback
    if callback is None or command in _marked:
        return
    summary = getattr(command, NOT_STARTED, None) is not None

    @functools.wraps(callback)
    def entered(*args: Any, **kwargs: Any) -> Any:
        _run.entered = _run.entered or summary
        _run.ctx = click.get_current_context()
        return callback(*args, **kwargs)

    command.callback = entered
    _marked.add(command)


class _Interrupted(BaseException):
    """Carries a command's KeyboardInterrupt (or Terminated) out past Click to main()."""

    def __init__(self, cause: KeyboardInterrupt):
        super().__init__()
        self.cause = cause


class LazyGroup(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            # `rq … | head`: the reader left, which is not an error. Click would exit 1 here, and the
            # interpreter's final flush would print a traceback, so point stdout at /dev/null and exit 0.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            raise click.exceptions.Exit(0) from None
        except KeyboardInterrupt as exc:
            # past Click, which would print an empty line to stderr before its Abort: the stderr
            # of an interrupted command is the one line main() writes
            raise _Interrupted(exc) from None

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name, (mod, _, _) in COMMANDS.items() if importlib.util.find_spec(mod) is not None]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = COMMANDS.get(cmd_name)
        if entry is None or importlib.util.find_spec(entry[0]) is None:
            return None
        command = getattr(importlib.import_module(entry[0]), entry[1])
        assert isinstance(command, click.Command)
        # every command reads RQ_<COMMAND>_<OPTION> from its flag's name (RQ_PRELOAD_JSON, not only
        # Click's RQ_PRELOAD_JSON_ from the parameter json_); idempotent, so a command module that
        # already did it is left as it is
        documented_env_names_everywhere(command, cmd_name.replace("-", "_"))
        _mark_entry(command)
        if cmd_name not in OWN_GC:
            gc.enable()  # off while rq imported (rqcli.console)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows, examples = [], []
        for name in self.list_commands(ctx):
            line = SHORT_HELP.get(name)
            if line is None:  # (not in the table: its module says)
                cmd = self.get_command(ctx, name)
                if cmd is None or cmd.hidden:
                    continue
                line = cmd.get_short_help_str(70)
            rows.append((name, line))
            examples.append(COMMANDS[name][2])
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)
            with formatter.section("Examples"):
                for example in examples:  # written as-is: wrapping would break copy-paste
                    formatter.write(f"{'':>{formatter.current_indent}}{example}\n")


def _print_traceback() -> None:
    import traceback  # -v on an error only: not worth its import on every start

    traceback.print_exc()


EPILOG = "\b\nExit codes:\n" + "\n".join(f"  {int(code):>3}  {text}" for code, text in EXIT_CODE_HELP.items())


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    # resolved only here: importlib.metadata costs every other rq command ~35 ms at start-up
    if not value or ctx.resilient_parsing:
        return
    from rqcli.versions import version_line

    click.echo(version_line())
    ctx.exit()


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]}, epilog=EPILOG)
@click.option("--json", "json_", is_flag=True, help="Machine output: one JSON object per line.")
@click.option("-q", "--quiet", is_flag=True, help="Only errors on stderr.")
@click.option("-v", "--verbose", count=True, help="More detail on stderr; tracebacks on errors.")
@click.option(
    "--config",
    "config_path",
    type=NonEmptyPath(dir_okay=False, path_type=Path),
    envvar="RQ_CONFIG",
    help="Config file (default ~/.config/rq/config.toml; /dev/null: none).",
)
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Show the version and exit.",
)
@click.pass_context
def cli(ctx: click.Context, json_: bool, quiet: bool, verbose: int, config_path: Path | None) -> None:
    """rq moves AI training data and checkpoints fast and safely.

    Preload datasets into a local RAM/disk cache, send checkpoints between machines,
    and tail or replay topics exactly.

    Settings come from flags, then RQ_<COMMAND>_<OPTION> environment variables,
    then the config file, then defaults.
    """
    ctx.obj = _run.out = Output(json=json_, quiet=quiet, verbose=verbose)
    show_logs(_run.out)
    ctx.default_map = load_config(config_path)
    check_config(ctx.default_map, cli, ctx, COMMANDS, config_path)


def _from_os_error(exc: OSError) -> CliError:
    code = {
        errno.ENOSPC: ExitCode.NO_SPACE,
        errno.EDQUOT: ExitCode.NO_SPACE,
        errno.ENOENT: ExitCode.NOT_FOUND,
        errno.EACCES: ExitCode.AUTH,
        errno.EPERM: ExitCode.AUTH,
        errno.ECONNREFUSED: ExitCode.UNREACHABLE,
        errno.EHOSTUNREACH: ExitCode.UNREACHABLE,
        errno.ECONNRESET: ExitCode.UNREACHABLE,
        errno.EEXIST: ExitCode.EXISTS,
        errno.ETIMEDOUT: ExitCode.UNREACHABLE,
    }.get(exc.errno or 0, ExitCode.FAILURE)
    where = f": {exc.filename}" if exc.filename else ""
    text = exc.strerror or str(exc)
    if not text:
        # a bare TimeoutError (an OSError) that some library let out: "rq: error: " and nothing
        # else told nobody anything
        return CliError(f"unexpected {type(exc).__name__}{where} (run with -v for the traceback)", code)
    return CliError(f"{text}{where}", code)


class _NeverRaised(click.ClickException):
    pass


# Click >= 8.2 raises this for a bare group call; it carries the help text, not an error line.
# (Click 8.1 prints the help itself and exits 0.)
_SHOW_HELP: type[click.ClickException] = getattr(click.exceptions, "NoArgsIsHelpError", _NeverRaised)


def _variable(ctx: click.Context, param: click.Parameter) -> str | None:
    """The environment variable a parameter's value came from, in the order Click reads them."""
    named = param.envvar if isinstance(param.envvar, list | tuple) else [param.envvar] if param.envvar else []
    auto = [f"{ctx.auto_envvar_prefix}_{(param.name or '').upper()}"] if ctx.auto_envvar_prefix else []
    order = [*auto, *named] if isinstance(param, CommandEnvFirst) else [*named, *auto]
    return next((v for v in order if os.environ.get(v)), None)


def _config_key(ctx: click.Context, param: click.Parameter) -> str:
    """`config file F: [table] key` for a parameter set by the config file, the key as written."""
    table = ".".join(ctx.command_path.split()[1:])
    flags = [o for o in getattr(param, "opts", []) if o.startswith("--")]
    key = config.written(table, param.name or "") or (flags[0][2:] if flags else param.name)
    return f"config file {config.read_from}: [{table}] {key}"


def _name_the_variable(exc: click.UsageError) -> str | None:
    """A bad value that came from the environment names its variable, not only the flag nobody
    typed: `Invalid value for '--workers' (from RQ_PRELOAD_WORKERS)`. One from the config file
    (a check only the option's callback makes, such as a size's) is said as the file's other errors
    are, naming the file, the table and the key: the message to print instead, else None."""
    if not isinstance(exc, click.BadParameter) or exc.ctx is None or exc.param is None or exc.param_hint:
        return None
    param, ctx = exc.param, exc.ctx
    if not param.name:
        return None
    source = ctx.get_parameter_source(param.name)
    if source is click.core.ParameterSource.DEFAULT_MAP and config.read_from is not None:
        return f"{_config_key(ctx, param)}: {exc.message}"
    if source is not click.core.ParameterSource.ENVIRONMENT:
        return None
    variable = _variable(ctx, param)
    if variable is not None:
        exc.param_hint = f"{param.get_error_hint(ctx)} (from {variable})"
    return None


def name_the_source(exc: CliError) -> CliError:
    """A usage error the running command raised about an option's value (`--chunk-size must be
    between …`, `got '127.0.0.1:18333'`) names where that value came from when nobody typed it:
    the config file's table and key, or the environment variable. The option is the one whose
    flag the message names, else the one whose value it quotes; the first set outside the command
    line. Every command at once, rather than each check of each option."""
    ctx = _run.ctx
    if ctx is None or exc.code is not ExitCode.USAGE:
        return exc
    sources = click.core.ParameterSource
    for param in ctx.command.params:
        if not isinstance(param, click.Option) or not param.name:
            continue
        source = ctx.get_parameter_source(param.name)
        if source not in (sources.ENVIRONMENT, sources.DEFAULT_MAP):
            continue
        if source is sources.ENVIRONMENT:
            variable = _variable(ctx, param)
            raw = os.environ.get(variable) if variable else None
        else:
            variable, raw = None, (ctx.default_map or {}).get(param.name)
        flag = next((f for f in param.opts if f.startswith("--") and _names(exc.message, f)), None)
        quoted = isinstance(raw, str) and _quotes(exc.message, raw)
        if flag is None and not quoted:
            continue
        if source is sources.DEFAULT_MAP:
            if config.read_from is None:
                return exc
            message = f"{_config_key(ctx, param)}: {exc.message}"
        elif variable is None:
            return exc
        elif flag is not None:
            at = _names(exc.message, flag)
            message = f"{exc.message[:at]} (from {variable}){exc.message[at:]}"
        else:
            message = f"{exc.message} (from {variable})"
        return CliError(message, exc.code, hint=exc.hint)
    typed = [
        value
        for p in ctx.command.params
        if p.name
        and ctx.get_parameter_source(p.name) is sources.COMMANDLINE
        and isinstance(value := ctx.params.get(p.name), str)
    ]
    # a value the libraries read from the environment themselves (AWS_ENDPOINT_URL: botocore's
    # rules, not Click's), quoted by the error and typed by nobody: a typed value quoted the same
    # way (a flag's URL whose user info the quote cut) is the flag's, not the variable's
    for variable, raw in sorted(os.environ.items()):
        if (
            variable.startswith(_LIBRARY_VARIABLES)
            and _quotes(exc.message, raw)
            and not any(_quotes(exc.message, value) for value in typed)
            and f"(from {variable})" not in exc.message  # (cache.s3 names some itself: AWS_MAX_ATTEMPTS)
        ):
            return CliError(f"{exc.message} (from {variable})", exc.code, hint=exc.hint)
    return exc


def _quotes(message: str, raw: str) -> bool:
    """Whether the message quotes the value, as typed or with its URL's user info cut
    (cache.s3's `got 'http://***@host'`)."""
    from cache.s3 import masked_url

    return len(raw) > 1 and (repr(raw) in message or repr(masked_url(raw)) in message)


# the environment variables rq's libraries read themselves (cache.s3, the topic clients)
_LIBRARY_VARIABLES = ("AWS_", "NATS_", "RQ_")


def _names(message: str, flag: str) -> int:
    """Where the flag's name ends in the message (0: not named there): `--format` in `--format is
    empty`, not in `--format-x`."""
    m = re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", message)
    return m.end() if m else 0


def _invoked(args: list[str]) -> tuple[str, click.Command]:
    """`rq send` and its command for `rq -q send --pin`: the (sub)commands named in args."""
    path, command = ["rq"], cli
    for arg in _words(args):
        if not isinstance(command, click.Group) or arg.startswith("-"):
            continue
        ctx = click.Context(command, info_name=path[-1])
        if arg in command.list_commands(ctx):
            path.append(arg)
            command = command.get_command(ctx, arg)  # type: ignore[assignment]
    return " ".join(path), command


def _words(args: list[str]) -> list[str]:
    """The arguments up to `--` (after it every word is an operand)."""
    return args[: args.index("--")] if "--" in args else args


def _json_asked(command: click.Command, args: list[str], ctx: click.Context | None) -> bool:
    """--json for a run Click may have stopped before it read the option: the group's Output, the
    word itself, else the command's own RQ_<COMMAND>_JSON (and config key, once its context exists)."""
    if (_run.out is not None and _run.out.json) or "--json" in _words(args):
        return True
    param = next((p for p in command.params if p.name == "json_"), None)
    if param is None:
        return False
    try:
        if ctx is not None and ctx.command is command:
            value, _source = param.consume_value(ctx, {})
        else:
            names = [param.envvar] if isinstance(param.envvar, str) else list(param.envvar or [])
            value = next((os.environ[n] for n in names if os.environ.get(n)), None)
        return value is not None and bool(click.BOOL.convert(value, param, ctx))
    except click.ClickException:
        return False


def _owed_summary(args: list[str], ctx: click.Context | None, error: str) -> None:
    """Under --json, the summary a command promises as its last line, for a run that never got to
    the command's own code (arguments refused, a signal while starting): `tail -n1` is the result."""
    if _run.entered:
        return
    try:
        command = ctx.command if ctx is not None and hasattr(ctx.command, NOT_STARTED) else _invoked(args)[1]
        summary: Callable[[str], dict[str, Any]] | None = getattr(command, NOT_STARTED, None)
        if summary is not None and _json_asked(command, args, ctx):
            Output(json=True).emit(summary(error))
    except (KeyboardInterrupt, OSError):
        pass  # a second Ctrl-C, or stdout's reader gone: the stderr line and exit code still say it


def _interrupted(args: list[str], exc: BaseException) -> int:
    if isinstance(exc, Terminated) and exc.signame in ("SIGTERM", "SIGHUP") and _a_receiver_ending(args):
        # how a receiver ends (docs/transfer.md, exit 0 without --once), also when the signal came
        # while rq was starting, before `rq recv` had its own handler: that was exit 130, "stopped by
        # SIGTERM", to a service manager stopping a receiver it had just started (nothing is made yet)
        return 0
    why = interruption(exc)
    _owed_summary(args, None, why)
    # what the command leaves behind, where it says (rq send: what the receiver holds, and that a
    # re-run resumes it)
    detail = getattr(exc, "rq_detail", None)
    with contextlib.suppress(OSError):
        click.echo(f"rq: {why}" + (f"; {detail}" if detail else ""), err=True)
    return int(ExitCode.INTERRUPTED)


# what a command can be given instead of a default path under the home directory
_PATH_OPTIONS = {
    "preload": "--cache-dir / RQ_CACHE_DIR",
    "cache": "--cache-dir / RQ_CACHE_DIR",
    "recv": "--cert-dir and --token-file (or RQ_TOKEN)",
    "send": "--token-file (or RQ_TOKEN)",
}
_ALL_PATH_OPTIONS = (
    "--cache-dir / RQ_CACHE_DIR, --topics-dir / RQ_TOPICS_DIR, and for rq recv --cert-dir and "
    "--token-file (or RQ_TOKEN)"
)


def _path_options(args: list[str]) -> str:
    """The path options of the command in `args` (the topics commands share --topics-dir)."""
    name = _invoked(args)[0].split(" ")
    if len(name) < 2:
        return _ALL_PATH_OPTIONS
    if name[1] in _PATH_OPTIONS:
        return _PATH_OPTIONS[name[1]]
    if name[1] in ("tail", "replay", "offsets", "produce"):
        return "--topics-dir / RQ_TOPICS_DIR"
    return _ALL_PATH_OPTIONS


def _short_of(exc: Exception, args: list[str]) -> CliError | None:
    """The process's limits, said as such: a thread that could not start (`rq send` under
    `ulimit -v`: "unexpected RuntimeError: can't start new thread"), memory that ran out."""
    if isinstance(exc, RuntimeError) and "can't start new thread" in str(exc):
        return CliError("cannot start a thread (memory or thread limit: ulimit -u / -v)")
    if isinstance(exc, MemoryError):
        return CliError("out of memory (memory limit: ulimit -v, or the container's)")
    if isinstance(exc, RuntimeError) and "could not determine the home directory" in str(exc):
        # platformdirs, for a default path: HOME unset and a uid without a passwd entry (OpenShift)
        return CliError(
            f"no home directory for rq's default paths (HOME is unset and uid {os.getuid()} has no "
            "passwd entry)",
            ExitCode.USAGE,
            hint=f"set HOME, or give the path: {_path_options(args)}",
        )
    return None


def _a_receiver_ending(args: list[str]) -> bool:
    """Whether `args` run `rq recv` without --once (nor RQ_RECV_ONCE, nor `once` in the config
    file's [recv] table)."""
    words = _words(args)
    if _invoked(args)[0] != "rq recv" or "--once" in words:
        return False
    env = os.environ.get("RQ_RECV_ONCE", "")
    if env:  # the environment beats the config file (flag > environment > config file)
        return env.lower() not in ("1", "true", "t", "yes", "y", "on")
    return _configured_once(words) is not True


def _configured_once(words: list[str]) -> Any:
    """[recv] once from the config file `words` name (or the default one); None where there is
    none or it cannot be read (the run is ending: its own error, if any, was never reached)."""
    path: Path | None = None
    for i, word in enumerate(words):
        if word == "--config" and i + 1 < len(words):
            path = Path(words[i + 1])
        elif word.startswith("--config="):
            path = Path(word.split("=", 1)[1])
    try:
        table = load_config(path).get("recv", {})
    except (CliError, OSError, ValueError):
        return None
    return table.get("once") if isinstance(table, dict) else None


def _terminate(signum: int, _frame: Any) -> None:
    raise Terminated(signal.Signals(signum).name)


def _stop_on(signum: int, handler: Any) -> None:
    """Installs a stop signal's handler unless the parent left the signal ignored (`nohup`)."""
    if signal.getsignal(signum) is not signal.SIG_IGN:
        signal.signal(signum, handler)


def _raise_open_files_limit() -> None:
    """The soft limit on open files up to the hard one, as Go programs (s5cmd, rclone) do at start:
    a default of 1,024 (or a CI runner's 256) failed preload objects one by one with EMFILE at
    256 requests in flight. A process may raise its soft limit to its hard one without privilege."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = hard if hard != resource.RLIM_INFINITY else 1 << 20
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ImportError, ValueError, OSError):  # not POSIX, or the kernel's nr_open is lower
        pass


def main(argv: list[str] | None = None) -> None:
    """Console-script entry: runs `rq` and turns every failure into one stderr line and an exit code."""
    console = argv is None
    args = list(sys.argv[1:] if argv is None else argv)
    verbose = any(a in ("-v", "--verbose") or (a.startswith("-v") and set(a[1:]) == {"v"}) for a in args)
    global _run
    _run = _Run()
    hide_logs()
    if console:
        _raise_open_files_limit()
    try:
        if threading.current_thread() is threading.main_thread():  # (signal.signal's own rule)
            for signum in (signal.SIGTERM, signal.SIGHUP):  # rq recv sets its own
                _stop_on(signum, _terminate)
        if console:
            # orjson's module init crashes the process (SIGSEGV) when a KeyboardInterrupt is raised
            # inside it (a Ctrl-C as `rq send` first imported it: 2 of 20 such runs, a second diff
            # review): imported here, while signals are still held (~1.5 ms; most commands use it)
            import orjson  # noqa: F401

            from rqcli.console import held_signals

            held = held_signals()  # came while rq was importing: answered as if they came now
            if held:
                if held[0] == signal.SIGINT:
                    raise KeyboardInterrupt()
                raise Terminated(signal.Signals(held[0]).name)
        rv: Any = cli.main(args=argv, prog_name="rq", standalone_mode=False, auto_envvar_prefix="RQ")
        code = int(rv) if isinstance(rv, int) else 0
    except CliError as exc:
        if verbose:
            _print_traceback()
        named = name_the_source(exc)
        # refused before the command ran (the config file, its table checked in the group's
        # callback): under --json the summary the command promises is still the last line
        if _run.ctx is None:
            _owed_summary(args, None, named.one_line())
        click.echo(f"rq: error: {named.one_line()}", err=True)
        code = int(named.code)
    except click.exceptions.Exit as exc:
        code = exc.exit_code
    except click.exceptions.Abort as exc:  # Click's wrapping of KeyboardInterrupt (and Terminated)
        code = _interrupted(args, exc.__cause__ or exc)
    except _SHOW_HELP as exc:  # plain `rq`: the help is the answer (exit 2, as Click has it)
        exc.show()
        code = exc.exit_code
    except click.UsageError as exc:
        # One line like every other error (Click's own shape is four), with where to look.
        # (Click's parser raises some, such as a missing option value, without a context)
        where = exc.ctx.command_path if exc.ctx is not None else _invoked(args)[0]
        err = CliError(
            _name_the_variable(exc) or exc.format_message(), ExitCode.USAGE, hint=f"see `{where} --help`"
        )
        _owed_summary(args, exc.ctx, err.one_line())
        click.echo(f"rq: error: {err.one_line()}", err=True)
        code = exc.exit_code
    except click.ClickException as exc:
        click.echo(f"rq: error: {CliError(exc.format_message()).one_line()}", err=True)
        code = exc.exit_code
    except (KeyboardInterrupt, _Interrupted) as exc:
        code = _interrupted(args, exc.cause if isinstance(exc, _Interrupted) else exc)
    except OSError as exc:
        if verbose:
            _print_traceback()
        err = _from_os_error(exc)
        click.echo(f"rq: error: {err.one_line()}", err=True)
        code = int(err.code)
    except Exception as exc:
        if verbose:
            _print_traceback()
        err = _short_of(exc, args) or CliError(
            f"unexpected {type(exc).__name__}: {exc} (run with -v for the traceback)"
        )
        click.echo(f"rq: error: {err.one_line()}", err=True)
        code = int(err.code)
    failed = _run.out.stdout_failed if _run.out is not None else None
    if failed is not None:
        # a command that goes on without stdout (preload, produce, send) found it unwritable: the
        # work is done, and the line says its output is not; exit 1 unless the run failed otherwise
        with contextlib.suppress(OSError):
            click.echo(f"rq: error: {failed.one_line()}", err=True)
        code = code or int(failed.code)
    teardown.leave(code, console)
