"""`rq preload`: fill the local RAM/disk cache from S3 prefixes or directories, verified."""

from __future__ import annotations

import contextlib
import errno
import gc
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from rqcli import teardown
from rqcli.errors import CliError, interruption, open_files_limit
from rqcli.exitcodes import ExitCode
from rqcli.output import Output, get_output, output_options, safe_text
from rqcli.params import CommandEnvFirst, NonEmptyPath, OnePerLine, Whole


def cache_error_to_cli(exc: Exception, sources: tuple[str, ...] = ()) -> CliError:
    """The cache library's exceptions, as one line and a documented exit code. `sources`, the
    SOURCE arguments of `rq preload`: one with a wildcard that is not there gets --include's hint."""
    from cache import errors as e
    from cache.index import IndexVersionError

    if isinstance(exc, e.NotFoundError):
        hint = _glob_hint(sources, str(exc))
        if hint is not None:
            return CliError(safe_text(str(exc)), ExitCode.NOT_FOUND, hint=hint)
        if "matches --include/--exclude" in str(exc):
            # the listing found objects: the filters left none, so "check the bucket" points away
            # from the cause, often aws s3's idiom (`--exclude '*' --include '*.tar'`), where
            # the later filter wins; here any --exclude beats every --include
            return CliError(safe_text(str(exc)), ExitCode.NOT_FOUND, hint=_FILTER_HINT)

    table: list[tuple[type[Exception], ExitCode, str | None]] = [
        (e.BadSourceError, ExitCode.USAGE, None),
        (e.UnsafeDirError, ExitCode.USAGE, None),
        (e.NotFoundError, ExitCode.NOT_FOUND, "check the bucket, prefix or path"),
        (e.DeniedError, ExitCode.AUTH, "check the permissions of the file or directory"),
        (e.UncacheableError, ExitCode.UNSUPPORTED, "copy it to a regular file first"),
        (IndexVersionError, ExitCode.UNSUPPORTED, None),  # (its message says what to do)
        (e.RamTierUnavailableError, ExitCode.UNSUPPORTED, None),  # (its message names --tier disk)
        (e.TlsError, ExitCode.AUTH, None),  # its own hint: what to fix depends on the refusal
        (e.AuthError, ExitCode.AUTH, "check AWS_PROFILE / AWS_ACCESS_KEY_ID and the endpoint"),
        (
            e.UnreachableError,
            ExitCode.UNREACHABLE,
            "check --endpoint-url; re-run the same command to continue",
        ),
        (e.VerifyError, ExitCode.VERIFY, "re-run to fetch again; `rq cache verify` lists corrupt entries"),
        (e.CacheFullError, ExitCode.NO_SPACE, "raise --ram-limit/--disk-limit, unpin, or `rq cache evict`"),
        (e.BusyError, ExitCode.FAILURE, "another rq is fetching it; try again"),
        # its message says a re-run meets the same reply: "re-run to continue" would contradict it
        (
            e.MisbehavingStoreError,
            ExitCode.UNREACHABLE,
            "check what answers at the endpoint (a proxy in front of it?)",
        ),
        (e.OriginError, ExitCode.UNREACHABLE, "the store kept failing; re-run to continue"),
    ]
    if isinstance(exc, e.CacheError) and out_of_descriptors(exc):
        # the process's open-files limit, not the store or the path: --endpoint-url is no help
        return CliError(
            safe_text(str(exc)), ExitCode.FAILURE, hint=_DESCRIPTORS_HINT.format(limit=open_files_limit())
        )
    if isinstance(exc, e.CacheFullError) and file_system_full(exc):
        # the file system ran out before the cap: a higher cap would only make it worse
        full = "free space there, lower --ram-limit/--disk-limit below its free space, or use another --cache-dir"
        if "out of inodes" in str(exc):  # a lower cap frees no inodes
            full = "delete files there, remount a tmpfs with a larger nr_inodes, or use another --cache-dir"
        message = str(exc)
        if over_quota(exc):
            # EDQUOT: the user's quota, not the file system, ran out; the words say which
            full = "free space within your disk quota (or have it raised), or use another --cache-dir"
            if "quota" not in message:
                message += " (the disk quota is used up)"
        return CliError(safe_text(message), ExitCode.NO_SPACE, hint=full)
    for cls, code, hint in table:
        if isinstance(exc, cls):
            return CliError(safe_text(str(exc)), code, hint=getattr(exc, "hint", None) or hint)
    return CliError(safe_text(str(exc)), ExitCode.FAILURE)


def _glob_hint(sources: tuple[str, ...], message: str) -> str | None:
    """A SOURCE is a prefix or directory, never a pattern (`rq preload 's3://b/train/*.tar'`, as
    s5cmd takes it, lists the prefix "train/*.tar"): where the one not found has a wildcard, the
    hint says how to ask for it, SOURCE cut at the last `/` before the wildcard and the rest given
    to --include. Whether the not-found message is that source's: it names the part from the
    wildcard's path component on (a local source appears in it as an absolute path)."""
    import re
    import shlex

    for source in sources:
        wild = re.search(r"[*?\[]", source)
        if wild is None:
            continue
        cut = source.rfind("/", 0, wild.start()) + 1
        base, pattern = source[:cut], source[cut:]
        glob = pattern + "*" if pattern.endswith("/") else pattern  # a "directory" pattern: what is under it
        # (a local path is named without its trailing /; a wildcard in a bucket name is no prefix)
        if pattern.rstrip("/") not in message or base.endswith("://"):
            continue
        example = f"rq preload {shlex.quote(base or '.')} --include {shlex.quote(glob)}"
        return f"SOURCE is a prefix or directory, not a pattern: use --include, e.g. `{example}`"
    return None


_FILTER_HINT = (
    "patterns are matched against keys relative to the SOURCE; an --exclude wins over every --include, "
    "whatever their order (as s5cmd; not aws s3's \"last filter wins\"): for `--exclude '*' --include '*.tar'` "
    "give `--include '*.tar'` alone"
)


_DESCRIPTORS_HINT = (
    "the process ran out of open files (limit {limit}): raise it (ulimit -n) or lower --workers; "
    "re-run the same command to continue"
)


def _causes(exc: BaseException) -> list[BaseException]:
    """exc and what it was raised from, in order; a chain that loops back on itself must not
    hang the CLI."""
    chain: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and all(seen is not c for c in chain):
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    return chain


def file_system_full(exc: BaseException) -> bool:
    """Whether a CacheFullError is the file system's ENOSPC/EDQUOT (or SQLite's "disk is full"),
    not a tier cap. The library raises one class for both; the cause chain tells them apart, and
    its messages for the file system case all begin "no space left"."""
    for seen in _causes(exc):
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if type(seen).__name__ == "OperationalError" and "full" in str(seen).lower():
            return True
    return str(exc).startswith("no space left")


def over_quota(exc: BaseException) -> bool:
    """Whether a file-system-full error is a disk quota used up (EDQUOT), not the disk."""
    return "disk quota" in str(exc) or any(
        isinstance(seen, OSError) and seen.errno == errno.EDQUOT for seen in _causes(exc)
    )


def out_of_descriptors(exc: BaseException) -> bool:
    """Whether the cause is EMFILE/ENFILE. The library reports a source it cannot open as it
    reports an unreachable store; the errno, or its text where the error was re-worded, tells."""
    for seen in _causes(exc):
        if isinstance(seen, OSError) and seen.errno in (errno.EMFILE, errno.ENFILE):
            return True
    return _says_out_of_files(str(exc))


def _says_out_of_files(message: str) -> bool:
    """EMFILE/ENFILE in a failure's words: the OS's, or the CRT's as cache.s3 words it."""
    return "Too many open files" in message or "ran out of open files" in message


def _warn_about_ram(out: Output, c: Any, ram_limit: int | None) -> None:
    """Said once, at the start, before the RAM tier fills: a cap lowered for this process (the
    RAM file system's headroom for others, a cgroup's bound: Cache.ram_cap_note; it came only at
    the end, as "more than it can hold"), and a cap that with what the cgroup uses now would pass
    its memory limit (RAM-tier files count against it: the kernel kills a process of the group,
    rq or the training job beside it; finding A)."""
    if c.ram_cap_note is not None:
        out.warn(c.ram_cap_note)
    warning = _past_cgroup(c, ram_limit)
    if warning is not None:
        out.warn(warning)


def _past_cgroup(c: Any, ram_limit: int | None) -> str | None:
    from cache import CacheError
    from cache.api import cgroup_room
    from cache.sizes import cgroup_memory_limit, format_size

    room = cgroup_room()
    limit = cgroup_memory_limit() if room is None else room[0]
    if limit is None:
        return None
    used = 0 if room is None else room[1]
    try:
        held = int(c.usage()["ram"]["bytes"])
    except (CacheError, OSError, KeyError):
        held = 0
    cap = int(c.caps["ram"])
    # the group's use, plus what the tier may still add (its files already there count in that
    # use when this group wrote them; those another group wrote count nowhere here)
    projected = used + max(0, cap - held)
    safe = max(0, limit - used + held) // 2
    kills = (
        "RAM-tier files count against it, and the kernel kills a process of the group (rq, or the "
        "job beside it) once it is reached"
    )
    if ram_limit is not None and ram_limit > limit // 2:
        return (
            f"--ram-limit {format_size(ram_limit)} is more than half this cgroup's memory limit of "
            f"{format_size(limit)} ({format_size(used)} of it in use now): {kills}; "
            f"{format_size(min(limit // 2, safe))} is safe"
        )
    if projected > limit:
        tier_part = f" (the RAM tier's {format_size(held)} counted once)" if held else ""
        what = (
            f"--ram-limit {format_size(cap)}"
            if ram_limit is not None
            else f"the RAM cap of {format_size(cap)}"
        )
        return (
            f"{what} with the {format_size(used)} this cgroup uses now{tier_part} passes its memory "
            f"limit of {format_size(limit)}: {kills}; "
            f"{format_size(min(limit // 2, safe))} is safe (--ram-limit)"
        )
    return None


def open_cache(cache_dir: Path | None, **kwargs: Any) -> Any:
    from cache import Cache, CacheError

    try:
        return Cache(cache_dir, **kwargs)
    except CacheError as exc:
        raise cache_error_to_cli(exc) from None


def _requested_root(cache_dir: Path | None) -> Path:
    from cache.api import default_cache_dir

    return cache_dir if cache_dir is not None else default_cache_dir()


def _cache_exists(cache_dir: Path | None) -> bool:
    from cache.layout import INDEX_NAME

    with contextlib.suppress(OSError):
        return (_requested_root(cache_dir) / INDEX_NAME).exists()
    return True  # cannot tell: Cache() says what is wrong with the directory


def _root_for_summary(cache_dir: Path | None) -> Path:
    """The cache dir a run stopped before opening it would have used (the summary names it)."""
    if cache_dir is None:
        with contextlib.suppress(Exception):
            return _requested_root(cache_dir)
    return cache_dir or Path("~/.cache/rq/cache").expanduser()


def _scratch_for_dry_run(cache_dir: Path | None) -> Any:
    """A dry run creates nothing: where no cache exists yet it plans against an empty throwaway
    one (everything would be fetched), after the same check a real run makes of the directory."""
    import tempfile

    from cache import CacheError
    from cache.layout import INDEX_NAME, check_cache_dir

    root = _requested_root(cache_dir)
    if (root / INDEX_NAME).is_file():
        return None
    try:
        check_cache_dir(root)
    except CacheError as exc:
        raise cache_error_to_cli(exc) from None
    return tempfile.TemporaryDirectory(prefix="rq-dry-run-")


def size_option(_ctx: click.Context, _param: click.Parameter, value: str | None) -> int | None:
    """Checked before the cache opens, so a bad --disk-limit cannot leave a new --ram-limit stored."""
    from cache.errors import BadSourceError
    from cache.sizes import parse_size

    if value is None:
        return None
    try:
        return parse_size(value)
    except BadSourceError as exc:
        raise click.BadParameter(str(exc)) from None


EXIT_FOR_KIND = {
    "not_found": ExitCode.NOT_FOUND,
    "auth": ExitCode.AUTH,
    "denied": ExitCode.AUTH,
    "verify": ExitCode.VERIFY,
    "changed": ExitCode.VERIFY,
    "no_space": ExitCode.NO_SPACE,
    "unreachable": ExitCode.UNREACHABLE,
    # 5xx or throttling that outlasted the retries, a store misbehaving: the code `rq cache cat`
    # gives the same failure (cache_error_to_cli: OriginError → 6); it was 1 here
    "origin": ExitCode.UNREACHABLE,
    "uncacheable": ExitCode.UNSUPPORTED,
}


def exit_for_kinds(kinds: set[str]) -> ExitCode:
    """A run's exit code from its failures' kinds: the code they all share (`origin` and
    `unreachable` both 6, `verify` and `changed` both 5), else 1 (docs/cache.md, "Exit codes")."""
    codes = {EXIT_FOR_KIND.get(kind, ExitCode.FAILURE) for kind in kinds}
    return codes.pop() if len(codes) == 1 else ExitCode.FAILURE


@click.command()
@click.argument("sources", nargs=-1, required=True)
@click.option(
    "--include",
    type=OnePerLine(),
    multiple=True,
    metavar="GLOB",
    help="Only keys (relative to the source) matching GLOB.",
)
@click.option("--exclude", type=OnePerLine(), multiple=True, metavar="GLOB", help="Skip keys matching GLOB.")
@click.option(
    "--tier", type=click.Choice(["ram", "disk"]), default="disk", show_default=True, help="Tier to fill."
)
@click.option(
    "--cache-dir",
    type=NonEmptyPath(file_okay=False, path_type=Path),
    envvar="RQ_CACHE_DIR",
    cls=CommandEnvFirst,
    help="Cache directory (default: ~/.cache/rq/cache; env RQ_CACHE_DIR).",
)
@click.option(
    "--ram-limit",
    metavar="SIZE",
    callback=size_option,
    help="Cap of the RAM tier, e.g. 8G (remembered by the cache).",
)
@click.option(
    "--disk-limit",
    metavar="SIZE",
    callback=size_option,
    help="Cap of the disk tier, e.g. 500G (remembered by the cache).",
)
@click.option("--workers", type=Whole(1, 4096), default=256, show_default=True, help="Requests in flight.")
# No envvar= for these two: cache.s3 reads AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL / AWS_PROFILE by
# botocore's rules (a profile from AWS_PROFILE does not override keys in the environment, a
# --profile flag does; AWS_IGNORE_CONFIGURED_ENDPOINT_URLS drops the variables, not the flag).
@click.option(
    "--endpoint-url",
    cls=CommandEnvFirst,
    help="S3 endpoint (MinIO, SeaweedFS, …); default as the aws CLI: AWS_ENDPOINT_URL_S3, "
    "AWS_ENDPOINT_URL, the profile's endpoint_url.",
)
@click.option(
    "--profile",
    cls=CommandEnvFirst,
    help="AWS profile for credentials; unlike AWS_PROFILE, it overrides keys in the environment.",
)
@click.option("--dry-run", is_flag=True, help="List what would be fetched; fetch nothing.")
@click.option(
    "--no-fsync",
    is_flag=True,
    help="Skip fsync before rename: faster on slow disks; a power cut may then lose entries, "
    "which the digest check on read detects and refetches.",
)
@output_options
def preload(
    sources: tuple[str, ...],
    include: tuple[str, ...],
    exclude: tuple[str, ...],
    tier: str,
    cache_dir: Path | None,
    ram_limit: int | None,
    disk_limit: int | None,
    workers: int,
    endpoint_url: str | None,
    profile: str | None,
    dry_run: bool,
    no_fsync: bool,
) -> None:
    """Preload S3 prefixes or directories into the local cache.

    Objects land verified (size, and ETag MD5 or the object's CRC checksum) with an xxh3 digest
    recorded; objects already cached at the same version are skipped, so re-running after a crash
    fetches only what is missing.

    \b
    Examples:
      rq preload s3://bucket/train/ --tier ram --ram-limit 64G
      rq preload s3://bucket/shards/ --include '*.tar' --json
      rq preload /mnt/nfs/dataset/
    """
    out = get_output()
    tally = Tally()
    started = time.monotonic()
    try:
        _preload(
            out, tally, started, sources, include, exclude, tier, cache_dir, ram_limit, disk_limit, workers,
            endpoint_url, profile, dry_run, no_fsync,
        )  # fmt: skip
    except KeyboardInterrupt as exc:
        # Ctrl-C or SIGTERM at any moment, even before the cache is open: the summary comes last
        if not tally.reported:
            stopped = CliError(interruption(exc), ExitCode.INTERRUPTED)
            root = tally.root if tally.root is not None else _root_for_summary(cache_dir)
            tally.reported = True
            report(
                out, tally.summary(time.monotonic() - started, tier, root, stopped, dry_run), dry_run=dry_run
            )
        raise


def _preload(
    out: Output,
    tally: Tally,
    started: float,
    sources: tuple[str, ...],
    include: tuple[str, ...],
    exclude: tuple[str, ...],
    tier: str,
    cache_dir: Path | None,
    ram_limit: int | None,
    disk_limit: int | None,
    workers: int,
    endpoint_url: str | None,
    profile: str | None,
    dry_run: bool,
    no_fsync: bool,
) -> None:
    from cache import CacheError
    from cache import events as ev
    from cache.preload import IGNORED_REPORTED, check_sources, check_sources_exist
    from cache.s3 import S3Settings, start_listings

    settings = S3Settings(endpoint_url=endpoint_url, profile=profile)

    def refused(err: CliError) -> CliError:
        """A failure before the cache is open: --json still ends with the aborted summary."""
        if out.json:
            tally.reported = True
            seconds = time.monotonic() - started
            report(
                out, tally.summary(seconds, tier, _root_for_summary(cache_dir), err, dry_run), dry_run=dry_run
            )
        return err

    try:
        check_sources(list(sources), settings)  # a bad argument creates nothing
        # the listing runs on the CRT's threads while the rest of the cache is imported and opened
        start_listings(settings, list(sources), include)  # (narrowed by --include as pages() lists)
        if not dry_run and not _cache_exists(cache_dir):
            # nor does a source that is not there (a missing bucket or directory, an empty
            # prefix): a new cache is made only once each source has listed something. The S3
            # listings' first pages are waited for here, after the imports they overlap with; a
            # first page that is the whole listing and that --include/--exclude leave empty too
            check_sources_exist(list(sources), settings, include, exclude)
    except CacheError as exc:
        raise refused(cache_error_to_cli(exc, sources)) from None
    try:
        scratch = _scratch_for_dry_run(cache_dir) if dry_run else None
        c = open_cache(
            cache_dir if scratch is None else Path(scratch.name) / "cache",
            ram_dir=None if scratch is None else Path(scratch.name) / "ram",
            # a dry run changes nothing: a limit given with it is not remembered for later runs
            ram_limit=None if dry_run else ram_limit,
            disk_limit=None if dry_run else disk_limit,
            endpoint_url=endpoint_url,
            profile=profile,
            durable=not no_fsync,
            # no RAM tier on this machine: refused (exit 10) before a new cache dir is made
            require_ram=tier == "ram",
        )
    except CliError as exc:  # not a cache (and not empty), unwritable, a cap too small, …
        raise refused(exc) from None
    root = c.root if scratch is None else _requested_root(cache_dir)
    tally.root = root
    if (tier == "ram" or ram_limit is not None) and scratch is None:
        # (a --ram-limit cut to /dev/shm's share beside --tier disk was cut without a word: dr5)
        _warn_about_ram(out, c, ram_limit)
    # a dry run prints its plan as it is listed (a line per object): no bar to draw around it
    with out.progress() if not dry_run else contextlib.nullcontext() as bar:
        task = bar.add_task("preload", total=None) if bar is not None else None

        def on_event(event: ev.Event) -> None:
            tally.add(event)
            if isinstance(event, ev.WouldFetch):
                out.emit({"event": "plan", "url": event.url, "size": event.size})
                if not out.json:
                    out.info(f"would fetch {safe_text(event.url)} ({event.size} bytes)")
            elif isinstance(event, ev.Failed):
                out.emit({"event": "failed", "url": event.url, "kind": event.kind, "message": event.message})
                if not out.json:  # most messages name the object already: say it once
                    named = event.url in event.message
                    out.warn(safe_text(event.message if named else f"{event.url}: {event.message}"))
            elif isinstance(event, ev.Demoted):
                out.emit(
                    {
                        "event": "demoted",
                        "url": event.url,
                        "size": event.size,
                        "tier": event.tier,
                        "reason": event.reason,
                    }
                )
            elif isinstance(event, ev.Ignored):
                out.emit({"event": "ignored", "url": event.url, "reason": event.reason})
                if not out.json:
                    out.warn(f"ignored {safe_text(event.url)}: {safe_text(event.reason)}")
            elif isinstance(event, ev.Retrying):
                out.debug(
                    f"retry {event.attempt} of {safe_text(event.url)} in {event.delay_s:.1f}s: {event.reason}"
                )
            elif bar is not None and task is not None:
                if isinstance(event, ev.Planned):
                    bar.update(task, total=event.bytes, description=f"{tally.landed}/{event.objects} objects")
                elif isinstance(event, ev.Landed):
                    bar.update(task, description=f"{tally.landed}/{tally.planned} objects")
                elif isinstance(event, ev.Progress):
                    bar.update(task, completed=event.bytes)

        # a short-lived process whose per-object objects are freed by refcount: the collector's
        # passes over every imported module's objects were ~4% of the run's CPU (perf); freeze them
        gc.freeze()
        gc.set_threshold(20_000, 20, 20)
        gc.enable()  # off since start-up (rqcli.console)
        from rqcli import malloc  # (ctypes: ~2 ms that `rq cache` does not need)

        malloc.keep_freed_memory()
        succeeded = False
        try:
            result = c.preload(
                list(sources),
                include=include,
                exclude=exclude,
                tier=tier,
                workers=workers,
                dry_run=dry_run,
                keep_planned=False,
                on_event=on_event,
            )
            # the caps this run filled the tiers under: the warnings below name them, not what
            # restore_limits() puts back after a failed run
            caps = dict(c.caps)
            succeeded = not result.failed
        except CacheError as exc:
            err = cache_error_to_cli(exc, sources)
            # what was done before the abort still lands in the summary: scripts read it either way
            summary = tally.summary(time.monotonic() - started, tier, root, err, dry_run)
            if out.json or tally.planned or tally.skipped or tally.landed or tally.failed:
                tally.reported = True
                report(out, summary, dry_run=dry_run)  # (a bad URL had nothing to report but itself)
            raise err from None
        except Exception as exc:
            # not one of the library's own (a bare OSError: a RAM tmp/ that became a file): the
            # summary still comes last, then the error as rq reports any other (exit 1)
            from rqcli.main import _from_os_error  # (the line rq prints for it, exit code and all)

            err = (
                _from_os_error(exc)
                if isinstance(exc, OSError)
                else CliError(safe_text(str(exc)) or type(exc).__name__, ExitCode.FAILURE)
            )
            tally.reported = True
            report(out, tally.summary(time.monotonic() - started, tier, root, err, dry_run), dry_run=dry_run)
            raise
        finally:
            if not succeeded:
                # a --ram-limit/--disk-limit is remembered only by a run that ends with exit 0
                # (it binds every process while the run lasts): a failed one puts the old cap back
                with contextlib.suppress(CacheError):
                    c.restore_limits()
            c.close()
            if scratch is not None:
                scratch.cleanup()
    # every byte is written (and fsynced, unless --no-fsync) and the index is closed: what the
    # interpreter's teardown would do (free objects, join idle threads) no longer matters
    teardown.skip_teardown()
    # a dry run fetches nothing: its counts are what a real run would fetch (big objects included)
    summary = {
        "event": "summary",
        "objects": result.planned_objects if dry_run else result.objects,
        "bytes": result.planned_bytes if dry_run else result.bytes,
        "skipped": result.skipped,
        "skipped_bytes": result.skipped_bytes,
        "resumed_bytes": result.resumed_bytes,
        "throttled": result.throttled,
        "smallest_window": result.smallest_window,
        "failed": len(result.failed),
        "seconds": round(result.seconds, 3),
        "mb_per_s": round(result.mb_per_s, 1),
        "tier": tier,
        "cache_dir": str(root),
        "dry_run": dry_run,
        "evicted_own": result.evicted_own,
        "demoted_own": result.demoted_own,
        "demoted_full": result.demoted_full,
        "not_resident": result.not_resident,
        "ignored": result.ignored,
        "aborted": False,  # (no "error" key: it comes only with "aborted": true)
    }
    tally.reported = True
    report(out, summary, dry_run, workers)
    evicted, demoted = result.evicted_own, result.demoted_own
    if evicted or demoted:
        from cache.sizes import format_size

        parts = [f"{evicted} evicted"] * bool(evicted) + [f"{demoted} moved to disk"] * bool(demoted)
        gone = ", ".join(parts)
        out.warn(
            f"{evicted + demoted} of the {result.objects} objects fetched did not stay in the "
            f"{tier} tier ({gone}) to make room for later ones: the data is bigger than the "
            f"{tier} tier's cap of {format_size(caps[tier])}; raise --{tier}-limit or preload less"
        )
    if result.demoted_full:
        out.warn(
            f"{result.demoted_full} of the objects asked for in the RAM tier are in the disk tier: "
            f"the RAM tier's file system under {c.layout.ram_root} is full ({_ram_fs_why(c, caps)})"
        )
    if result.not_resident:
        from cache.sizes import format_size

        out.warn(
            f"{result.not_resident} objects of the set cached before this run are in the disk tier, "
            f"not in RAM: the set is bigger than the RAM tier's cap of {format_size(caps['ram'])}; "
            "raise --ram-limit or preload less"
        )
    if result.ignored > IGNORED_REPORTED:
        out.warn(
            f"the store listed {result.ignored} keys that are not the source's objects (outside the prefix, "
            f"or listed twice); the first {IGNORED_REPORTED} are named above, none was fetched"
        )
    if result.failed:
        code = exit_for_kinds({f.kind for f in result.failed})
        # (a dry run fetches nothing: its objects are those it would fetch)
        done = result.planned_objects if dry_run else result.objects
        # exit 6: the store failed or went away, not the objects: what landed is kept
        hint = (
            "the source kept failing or was lost: re-run the same command to continue"
            if code == ExitCode.UNREACHABLE
            else None
        )
        if any(_says_out_of_files(f.message) for f in result.failed):
            # the process's open-files limit, not the store: exit 6's "the source kept failing" misled
            code, hint = ExitCode.FAILURE, _DESCRIPTORS_HINT.format(limit=open_files_limit())
        raise CliError(f"{len(result.failed)} of {len(result.failed) + done} objects failed", code, hint)


@dataclass
class Tally:
    """What the events said so far: the summary of a run the library aborted (it returns no result then)."""

    planned: int = 0
    planned_bytes: int = 0
    skipped: int = 0
    skipped_bytes: int = 0
    landed: int = 0  # (counts only: a run may land millions of objects)
    landed_bytes: int = 0
    failed: int = 0
    root: Path | None = None  # the cache's, once it is open
    reported: bool = False  # the summary line is out (an interrupt after it adds none)

    def add(self, event: Any) -> None:
        from cache import events as ev

        if isinstance(event, ev.Landed):
            self.landed += 1
            self.landed_bytes += event.size
        elif isinstance(event, ev.Failed):
            self.failed += 1
        elif isinstance(event, ev.Planned):
            self.planned, self.skipped, self.skipped_bytes = event.objects, event.skipped, event.skipped_bytes
            self.planned_bytes = event.bytes

    def summary(
        self, seconds: float, tier: str, root: Path, err: CliError, dry_run: bool = False
    ) -> dict[str, Any]:
        """A dry run's counts are what it planned before it stopped (the plan lines printed)."""
        from rqcli.main import name_the_source

        nbytes = self.landed_bytes
        return {
            "event": "summary",
            "objects": self.planned if dry_run else self.landed,
            "bytes": self.planned_bytes if dry_run else nbytes,
            "skipped": self.skipped,
            "skipped_bytes": self.skipped_bytes,
            # no resumed_bytes, throttled, smallest_window, evicted_own, demoted_own: known only to
            # a run that finished (a key that does not apply is left out, never null)
            "failed": self.failed,
            "seconds": round(seconds, 3),
            "mb_per_s": round(nbytes / 1e6 / seconds, 1) if seconds > 0 else 0.0,
            "tier": tier,
            "cache_dir": str(root),
            "dry_run": dry_run,
            "aborted": True,
            "error": name_the_source(err).one_line(),  # stderr's line: where a bad value came from
        }


def report(out: Output, summary: dict[str, Any], dry_run: bool, workers: int | None = None) -> None:
    """The summary: one JSON line under --json, else one human line on stdout. A run the store
    throttled says so there (how often, and how far concurrency fell from `workers`): --json had
    it, the human line looked like a merely slow store."""
    out.emit(summary)
    if out.json:
        return
    objects, mib, skipped = summary["objects"], summary["bytes"] / 2**20, summary["skipped"]
    if dry_run:
        so_far = " before the listing stopped" if summary["aborted"] else ""
        out.info(f"would fetch {objects} objects ({mib:.1f} MiB){so_far}; {skipped} already cached")
        return
    verb = "stopped after" if summary["aborted"] else "preloaded"
    out.info(
        f"{verb} {objects} objects ({mib:.1f} MiB) in {summary['seconds']:.2f} s "
        f"({summary['mb_per_s']:.0f} MB/s); {skipped} already cached; {summary['failed']} failed"
        f"{_backed_off(summary, workers)}"
    )


def _backed_off(summary: dict[str, Any], workers: int | None) -> str:
    """'; throttled by the store 2 times; concurrency fell to 64 of 256', or '' when the run kept
    its concurrency. The window is cut only by the store's throttling (SlowDown/503 past the CRT's
    retries, counted in `throttled`) or by the process's open-files limit (not counted there)."""
    throttled = int(summary.get("throttled") or 0)
    smallest = summary.get("smallest_window")
    of = f" of {workers}" if workers is not None else ""
    fell = smallest is not None and (workers is None or smallest < workers)
    if throttled:
        times = "once" if throttled == 1 else f"{throttled} times"
        return f"; throttled by the store {times}" + (f"; concurrency fell to {smallest}{of}" if fell else "")
    if fell and workers is not None:
        return f"; concurrency fell to {smallest}{of} (the process's open-files limit)"
    return ""


def _ram_fs_why(c: Any, caps: dict[str, int]) -> str:
    """Why the RAM tier's file system was full, from what the index says the tier holds against
    the file system's size: rq's own entries (the cap is above what it holds), or others' files."""
    import os

    from cache import CacheError
    from cache.sizes import format_size

    try:
        held = int(c.usage()["ram"]["bytes"])
        fs = os.statvfs(c.layout.ram_root)
    except (OSError, CacheError):
        return "free some there"
    size = fs.f_blocks * fs.f_frsize
    if held * 2 >= size:
        return (
            f"rq's RAM tier holds {format_size(held)} of its {format_size(size)}: the RAM tier's cap of "
            f"{format_size(caps['ram'])} is more than it can hold; lower --ram-limit below "
            f"{format_size(size)}, or preload less"
        )
    return (
        f"rq's RAM tier holds {format_size(held)} of its {format_size(size)}; the rest is taken by "
        "files that are not this cache's (other programs', or another rq cache's RAM tier: "
        "`rq cache orphans` lists those left by deleted caches): free some there"
    )
