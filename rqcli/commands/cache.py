"""`rq cache …`: look inside the local cache and manage it."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

from rqcli.commands.preload import cache_error_to_cli, open_cache
from rqcli.errors import CliError
from rqcli.exitcodes import ExitCode
from rqcli.output import get_output, output_options, safe_text, stdout_error
from rqcli.params import CommandEnvFirst, NonEmptyPath, Seconds

cache_dir_option = click.option(
    "--cache-dir",
    type=NonEmptyPath(file_okay=False, path_type=Path),
    envvar="RQ_CACHE_DIR",
    cls=CommandEnvFirst,
    help="Cache directory (default: ~/.cache/rq/cache; env RQ_CACHE_DIR).",
)

# The commands that may reach the origin: a miss is fetched, and a cached S3 entry older than its
# max age (60 s) is revalidated there first, so a store that is not AWS needs its endpoint on a hit too.
# No envvar= for these two: cache.s3 reads AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL / AWS_PROFILE by
# botocore's rules (a profile from AWS_PROFILE does not override keys in the environment, a
# --profile flag does; AWS_IGNORE_CONFIGURED_ENDPOINT_URLS drops the variables, not the flag).
endpoint_option = click.option(
    "--endpoint-url",
    cls=CommandEnvFirst,
    help="S3 endpoint (MinIO, SeaweedFS, …), to revalidate a stale entry or fetch a miss "
    "(default as the aws CLI: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the profile's endpoint_url).",
)
profile_option = click.option(
    "--profile",
    cls=CommandEnvFirst,
    help="AWS profile, to revalidate a stale entry or fetch a miss (default AWS_PROFILE; "
    "the flag, unlike AWS_PROFILE, overrides keys in the environment).",
)


def _size(n: int) -> str:
    from cache.sizes import format_size

    return format_size(n)


def _guard(fn: Callable[[], Any]) -> Any:
    from cache import CacheError

    try:
        return fn()
    except CacheError as exc:
        raise cache_error_to_cli(exc) from None


def _guard_one(c: Any, url: str, fn: Callable[[], Any]) -> Any:
    """_guard for `stat` and `path`, whose "not cached" says so when entries are cached under URL/
    (a prefix typed without its slash), as `cat` does."""
    from cache import CacheError, NotFoundError
    from cache.origins import normalise_url

    try:
        return fn()
    except NotFoundError as exc:
        error = cache_error_to_cli(exc)
        try:
            under = normalise_url(url) + "/"
            if next(iter(c.iter_entries(under)), None) is not None:
                shown = safe_text(under)
                error.hint = (
                    f"entries are cached under {shown}: name one of them (`rq cache ls {shown}` lists them)"
                )
        except (CacheError, OSError):
            pass  # the hint is extra: the not-found line stands as it is
        raise error from None
    except CacheError as exc:
        raise cache_error_to_cli(exc) from None


def _guard_iter(items: Iterator[Any]) -> Iterator[Any]:
    """_guard for what a generator raises as it is read."""
    from cache import CacheError

    try:
        yield from items
    except CacheError as exc:
        raise cache_error_to_cli(exc) from None


def open_existing(cache_dir: Path | None, **kwargs: Any) -> Any:
    """The cache these commands inspect or change must exist: a typo in --cache-dir should say
    so, not show an empty cache it has just created. `kwargs` go to Cache (the S3 settings)."""
    from cache.api import default_cache_dir
    from cache.layout import INDEX_NAME

    root = cache_dir if cache_dir is not None else default_cache_dir()
    if not (root / INDEX_NAME).is_file():
        raise CliError(
            f"no rq cache at {safe_text(str(root))}",
            ExitCode.NOT_FOUND,
            hint="check --cache-dir / RQ_CACHE_DIR; `rq preload` creates the cache",
        )
    return open_cache(root, **kwargs)


def _warn_stale(event: Any) -> None:
    """What the library tells a read: ServedStale (the bytes are the verified cached copy, but
    nobody could say whether the origin still holds that version) and Damaged (the cached copy
    was damaged and dropped; the read goes to the origin instead: the disk is suspect)."""
    from cache.events import Damaged, ServedStale

    out = get_output()
    if isinstance(event, ServedStale):
        out.emit(
            {
                "event": "served_stale",
                "url": event.url,
                "checked_s": round(event.checked_s, 1),
                "reason": event.reason,
            }
        )
        out.warn(
            f"served the cached copy of {safe_text(event.url)} without checking it is current "
            f"(last confirmed {event.checked_s:.0f} s ago): {safe_text(event.reason)}"
        )
    elif isinstance(event, Damaged):
        out.emit({"event": "damaged", "url": event.url, "path": event.path, "reason": event.reason})
        out.warn(
            f"dropped a damaged cached copy ({safe_text(event.reason)}; it was "
            f"{safe_text(event.path)}), reading {safe_text(event.url)} from the origin instead: "
            "check the disk under the cache (`rq cache verify` checks every entry)"
        )


def _nothing_matched(pattern: str) -> CliError:
    """Every command taking a PATTERN exits 3 when it matches no entry, so a typo in a script shows."""
    return CliError(
        f"no cached entry matches {safe_text(pattern)}",
        ExitCode.NOT_FOUND,
        hint="`rq cache ls` lists what is cached; a prefix ends in /",
    )


@click.group()
@output_options  # `rq cache --json du` as well as `rq --json cache du` and `rq cache du --json`
def cache() -> None:
    """Inspect and manage the local cache (see docs/cache.md for the layout).

    A PATTERN is a URL, a prefix ending in /, or a glob; one without a scheme is a local path
    made absolute against the working directory ('s3://bucket/*' matches a bucket's entries).

    \b
    Examples:
      rq cache du
      rq cache ls 's3://bucket/train/*'
      rq cache verify --repair
      rq cache pin s3://bucket/val/
    """


@cache.command("ls")
@click.argument("pattern", required=False)
@cache_dir_option
@output_options
def ls(pattern: str | None, cache_dir: Path | None) -> None:
    """List cached entries (all, or those matching a URL, a prefix ending in /, or a glob).

    A PATTERN without a scheme is a local path made absolute against the working directory, so
    '*' never matches an s3:// entry: use 's3://bucket/*' for those.

    Example: rq cache ls 's3://bucket/train/*.tar'
    """
    out = get_output()
    c = open_existing(cache_dir)
    listed = 0
    # streamed a page of the index at a time: the first line comes at once and memory stays one
    # page, however many entries there are (it was the whole index, then the first line)
    for e in _guard_iter(c.iter_entries(pattern)):
        listed += 1
        out.emit(
            {
                "event": "entry",
                "url": e.url,
                "size": e.size,
                "tier": e.tier,
                "pinned": e.pinned,
                "version": e.version,
                "last_access": e.last_access,
            }
        )
        if not out.json:
            pin = "P" if e.pinned else "-"
            out.result(f"{e.tier:<4} {pin} {e.size:>14}  {safe_text(e.url)}")
    if pattern is not None and not listed:
        raise _nothing_matched(pattern)


@cache.command("du")
@cache_dir_option
@output_options
def du(cache_dir: Path | None) -> None:
    """Usage of each tier against its cap.

    Example: rq cache du --json
    """
    out = get_output()
    c = open_existing(cache_dir)
    usage = _guard(c.usage)
    # a machine without a usable RAM tier: no RAM path to name (its cap is 0), but why there is none
    ram_dir = None if c.ram_unavailable is not None else str(c.layout.ram_root)
    out.emit(
        {
            "event": "summary",
            "cache_dir": str(c.root),
            "ram_dir": ram_dir,
            "ram_unavailable": c.ram_unavailable,
            # a recorded RAM cap above half this process's cgroup memory limit: the cap used here
            "ram_cap_note": c.ram_cap_note,
            **usage,
        }
    )
    if not out.json:
        ram = f"RAM tier {c.layout.ram_root}" if ram_dir is not None else "no RAM tier on this machine"
        out.result(f"cache {c.root} ({ram})")
        if c.ram_cap_note is not None:
            out.result(c.ram_cap_note)
        for tier, u in usage.items():
            out.result(
                f"{tier:<4} {u['objects']:>8} objects  {_size(u['bytes']):>11} of {_size(u['limit']):>11}"
                f"  pinned {_size(u['pinned'])}  in flight {_size(u['held'])}"
            )


@cache.command("stat")
@click.argument("url")
@cache_dir_option
@output_options
def stat(url: str, cache_dir: Path | None) -> None:
    """Everything the index knows about one entry.

    Example: rq cache stat s3://bucket/train/000123.tar
    """
    _one_object(url)
    out = get_output()
    c = open_existing(cache_dir)
    e = _guard_one(c, url, lambda: c.stat(url))
    data = {**e.__dict__, "path": str(c.layout.blob_path(e.tier, e.blob))}
    out.emit({"event": "summary", **data})
    if not out.json:
        for key, value in data.items():
            if key in ("last_access", "checked_at", "created"):
                # local time with its offset: without one it was ambiguous (other zones, a DST overlap)
                value = time.strftime("%Y-%m-%d %H:%M:%S %z", time.localtime(float(value)))
            out.result(f"{key:<12} {safe_text(str(value))}")


@cache.command("path")
@click.argument("url")
@click.option(
    "--no-check",
    is_flag=True,
    help="Print the entry's file as cached, without asking the origin whether it changed.",
)
@cache_dir_option
@endpoint_option
@profile_option
@output_options
def path(
    url: str, no_check: bool, cache_dir: Path | None, endpoint_url: str | None, profile: str | None
) -> None:
    """The local file holding a cached URL (read-only; do not write to it).

    Like `rq cache cat`, it first revalidates the entry (a directory origin always, S3 after 60 s)
    and fetches it again if the origin changed or the cached file is gone, so a store that is not
    AWS needs --endpoint-url (or AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL) here as for `rq preload`.
    A URL that is not cached exits 3.

    Example: tar tf "$(rq cache path s3://bucket/shard-0001.tar --endpoint-url http://minio:9000)"
    """
    _one_object(url)
    out = get_output()
    c = open_existing(cache_dir, endpoint_url=endpoint_url, profile=profile, on_event=_warn_stale)
    p = _guard_one(c, url, lambda: c.path(url, fresh=not no_check))
    out.emit({"event": "summary", "url": url, "path": str(p)})
    out.result(str(p))


@cache.command("cat")
@click.argument("url")
@cache_dir_option
@endpoint_option
@profile_option
@output_options
def cat(url: str, cache_dir: Path | None, endpoint_url: str | None, profile: str | None) -> None:
    """Write a cached object to stdout (a miss is fetched, verified and cached first; a cached S3
    entry older than 60 s is first revalidated at the origin, as with `rq cache path`).

    Example: rq cache cat s3://bucket/meta.json | jq .
    """
    out = get_output()
    if out.json:
        # stdout is the object's bytes: mixing JSON lines into them would corrupt both
        asked = _json_for_cat(click.get_current_context())
        if asked is not None:
            raise CliError(
                f"rq cache cat writes the object's bytes, not JSON: {asked}",
                ExitCode.USAGE,
                hint="`rq cache stat URL --json` describes the entry",
            )
        # a group-wide setting (RQ_JSON, RQ_CACHE_JSON, [cache] json) asks for machine output where
        # a command has one; cat's output is the bytes, so it writes them (and no JSON line)
        out.json = False
    _one_object(url)
    from cache import BadSourceError, CacheError, NotFoundError, VerifyError

    c = open_cache(cache_dir, endpoint_url=endpoint_url, profile=profile, on_event=_warn_stale)
    try:
        handle = c.open(url)
    except VerifyError as exc:
        error = cache_error_to_cli(exc)
        try:
            c.stat(url)
        except (NotFoundError, BadSourceError):
            # nothing is cached for it (a miss, or the damaged copy dropped): there is no corrupt
            # entry for `rq cache verify` to list
            error.hint = "re-run to fetch again"
        except CacheError:
            pass  # the index cannot say (busy, unreadable): the verification error is the news
        raise error from None
    except NotFoundError as exc:
        error = cache_error_to_cli(exc)
        error.hint = _prefix_hint(c, url, endpoint_url, profile) or error.hint
        raise error from None
    except CacheError as exc:
        raise cache_error_to_cli(exc) from None
    with handle:
        sink = sys.stdout.buffer
        while chunk := handle.read(1 << 20):
            _to_stdout(lambda: sink.write(chunk))
        _to_stdout(sink.flush)
    c.close()


def _one_object(url: str) -> None:
    """`cat`, `path` and `stat` name one object: a prefix (a trailing /) or a bucket alone is a
    usage error for each of them alike (path and stat said "not cached", exit 3, where cat said 2)."""
    if url.endswith("/") and url not in ("/", "file:///"):
        raise CliError(f"{safe_text(url)} names a prefix or directory, not one object", ExitCode.USAGE)
    if url[:5].lower() == "s3://" and "/" not in url[5:]:
        raise CliError(f"{safe_text(url)} names a bucket, not an object (s3://bucket/key)", ExitCode.USAGE)


def _prefix_hint(c: Any, url: str, endpoint_url: str | None, profile: str | None) -> str | None:
    """For a URL not found at the origin: whether it is a prefix typed without its /. Asked only on
    that path (one cached-entry lookup, then for S3 one listing request of up to a page)."""
    from cache import CacheError
    from cache.origins import normalise_url

    try:
        under = normalise_url(url) + "/"
        found = next(iter(c.iter_entries(under)), None) is not None
        if not found and under.startswith("s3://"):
            from cache.s3 import S3Settings, shared_client, split_s3_url

            bucket, key = split_s3_url(under)
            client = shared_client(S3Settings(endpoint_url=endpoint_url, profile=profile))
            found = next(iter(client.list_objects(bucket, key)), None) is not None
    except (CacheError, OSError):
        return None  # the hint is extra: the not-found line stands as it is
    if not found:
        return None
    shown = safe_text(under)
    return f"objects are under {shown}: name one of them (`rq cache ls {shown}` lists those cached)"


def _json_for_cat(ctx: click.Context) -> str | None:
    """Why `rq cache cat` must refuse the --json in effect, else None (cat then ignores it): typed
    on the command line anywhere (`rq --json cache cat`, `rq cache cat --json`), or set for cat
    itself (RQ_CACHE_CAT_JSON, [cache.cat] json; main() names which). A setting for the whole group
    or for every command is not a request for cat's output to be JSON."""
    sources = click.core.ParameterSource
    level: click.Context | None = ctx
    while level is not None:
        source = level.get_parameter_source("json_")
        if source is sources.COMMANDLINE:
            return "drop --json"
        if level is ctx and source in (sources.ENVIRONMENT, sources.DEFAULT_MAP) and _json_set(ctx):
            return "--json is set for it"
        level = level.parent
    return None


def _json_set(ctx: click.Context) -> bool:
    """Whether cat's own --json setting (its variable or config key) is true (`RQ_CACHE_CAT_JSON=0`
    beside a group-wide RQ_CACHE_JSON=1 is not)."""
    param = next(p for p in ctx.command.params if p.name == "json_")
    value, _source = param.consume_value(ctx, {})
    return bool(param.type_cast_value(ctx, value))


def _to_stdout(write: Callable[[], object]) -> None:
    """A write of `rq cache cat`'s data: a full disk or a closed stdout is stdout's error (exit 1),
    not the cache's (exit 7 says the cache's disk is full). The reader gone stays BrokenPipeError."""
    try:
        write()
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise stdout_error(exc) from None


# cat refuses --json (its stdout is the object's bytes): not offered in its --help either
for _param in cat.params:
    if _param.name == "json_" and isinstance(_param, click.Option):
        _param.hidden = True


@cache.command("verify")
@click.argument("pattern", required=False)
@click.option(
    "--repair",
    is_flag=True,
    help="Drop corrupt and unreadable entries (the next read or preload refetches them).",
)
@cache_dir_option
@output_options
def verify(pattern: str | None, repair: bool, cache_dir: Path | None) -> None:
    """Re-hash cached files against their recorded xxh3 and name every corrupt one, and every one
    that cannot be read back (an I/O error), then check the rest (exit 5).

    Example: rq cache verify --repair
    """
    out = get_output()
    c = open_existing(cache_dir)

    def found(p: Any) -> None:  # each as it is found, not all at the end
        out.emit({"event": p.kind, "url": p.url, "problem": p.problem, "repaired": repair})
        if not out.json:
            out.result(
                f"{p.kind.upper()} {safe_text(p.url)}: {safe_text(p.problem)}"
                + (" (dropped)" if repair else "")
            )

    dropped: list[str] = []

    def gone(url: str) -> None:  # a RAM entry whose file was gone: evicted, not corrupt
        dropped.append(url)
        out.emit({"event": "dropped", "url": url, "reason": "RAM file gone (evicted)"})

    checked, problems = _guard(lambda: c.verify(pattern, repair=repair, on_problem=found, on_dropped=gone))
    unreadable = sum(1 for p in problems if p.kind == "unreadable")
    corrupt = len(problems) - unreadable
    out.emit(
        {
            "event": "summary",
            "checked": checked,
            "corrupt": corrupt,
            "unreadable": unreadable,
            "repaired": repair,
            "dropped": len(dropped),
        }
    )
    counts = " and ".join(
        f"{n} {what}" for n, what in ((corrupt, "corrupt"), (unreadable, "unreadable")) if n or not problems
    )
    if not out.json:
        also = f" ({len(dropped)} RAM entries whose file was gone dropped as evicted)" if dropped else ""
        out.info(f"checked {checked} entries: {counts}{also}")
    if pattern is not None and checked == 0:
        raise _nothing_matched(pattern)
    if problems and not repair:
        hint = "run `rq cache verify --repair`"
        if unreadable:
            hint += "; unreadable files: the disk under the cache may be failing (see dmesg)"
        raise CliError(f"{counts} entries", ExitCode.VERIFY, hint=hint)


@cache.command("evict")
@click.argument("pattern")
@cache_dir_option
@output_options
def evict(pattern: str, cache_dir: Path | None) -> None:
    """Drop matching entries now (pinned and open ones are kept).

    Example: rq cache evict 's3://bucket/old/*'
    """
    out = get_output()
    c = open_existing(cache_dir)
    done, skipped = _guard(lambda: c.evict(pattern))
    out.emit({"event": "summary", "matched": done + skipped, "evicted": done, "kept": skipped})
    if not out.json:
        out.info(f"evicted {done}; kept {skipped} (pinned or open)")
    if done + skipped == 0:
        raise _nothing_matched(pattern)


def _pin(pattern: str, cache_dir: Path | None, pinned: bool) -> None:
    out = get_output()
    c = open_existing(cache_dir)
    n = _guard(lambda: c.pin(pattern, pinned))
    out.emit({"event": "summary", "pinned" if pinned else "unpinned": n})
    if not out.json:
        out.info(f"{'pinned' if pinned else 'unpinned'} {n} entries")
    if n == 0:
        raise _nothing_matched(pattern)


@cache.command("pin")
@click.argument("pattern")
@cache_dir_option
@output_options
def pin(pattern: str, cache_dir: Path | None) -> None:
    """Keep matching entries from eviction.

    Example: rq cache pin s3://bucket/val/
    """
    _pin(pattern, cache_dir, True)


@cache.command("unpin")
@click.argument("pattern")
@cache_dir_option
@output_options
def unpin(pattern: str, cache_dir: Path | None) -> None:
    """Let matching entries be evicted again.

    Example: rq cache unpin s3://bucket/val/
    """
    _pin(pattern, cache_dir, False)


@cache.command("clear")
@cache_dir_option
@click.option("--yes", is_flag=True, help="Do not ask (required when stdin is not a terminal).")
@output_options
def clear(cache_dir: Path | None, yes: bool) -> None:
    """Remove every entry not open by a reader (pins too) and leftover partial downloads.

    Example: rq cache clear --yes
    """
    out = get_output()
    c = open_existing(cache_dir)
    if not yes:
        if not sys.stdin.isatty():  # nobody to ask: a script must say it means it, as with rm -i
            raise CliError(
                f"not cleared: {c.root}", ExitCode.USAGE, hint="pass --yes to clear without asking"
            )
        if not click.confirm(f"clear {c.root}?"):
            # an answer, not a usage error and not a failure: exit 0, as `rm -i` does when told no
            out.emit({"event": "summary", "removed": 0, "kept_open": 0, "declined": True})
            out.info("not cleared")
            return
    done, skipped = _guard(c.clear)
    out.emit({"event": "summary", "removed": done, "kept_open": skipped})
    if not out.json:
        out.info(f"removed {done}; kept {skipped} open by readers")


def _json_path(path: Path) -> str:
    """A path for --json, whose encoder takes only valid UTF-8: undecodable bytes as \\xNN."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


@cache.command("orphans")
@click.option("--remove", is_flag=True, help="Remove the orphaned and empty ones.")
@click.option(
    "--min-age",
    type=Seconds(),
    default=60.0,
    show_default=True,
    help="Seconds a tier must have been left unchanged to count.",
)
@output_options
def orphans(remove: bool, min_age: float) -> None:
    """RAM tiers in /dev/shm left by caches whose directory was deleted (they hold RAM outside
    every cap). Tiers in use by a process, or changed within --min-age, are never listed.

    \b
    Examples:
      rq cache orphans
      rq cache orphans --remove
    """
    from cache import orphans as found_roots

    out = get_output()
    removed = freed = 0
    roots = found_roots.find(min_age=min_age)
    for root in roots:
        gone = remove and found_roots.remove(root, min_age)
        if gone:
            removed += 1
            freed += root.size
        out.emit(
            {
                "event": "ram_tier",
                "path": str(root.path),
                "cache_dir": None if root.owner is None else _json_path(root.owner),
                "bytes": root.size,
                "state": root.state,
                "removed": gone,
            }
        )
        if not out.json:
            what = {
                "orphan": f"its cache {safe_text(str(root.owner))} is gone",
                "empty": "empty, no cache recorded",
                "unclaimed": "made by an older rq (no owner recorded); remove it by hand if no cache uses it",
                "removing": "left half-deleted by an interrupted removal",
            }[root.state]
            done = "removed  " if gone else ""
            out.result(f"{done}{root.path}  {_size(root.size):>11}  {what}")
    left = sum(1 for r in roots if r.state != "unclaimed") - removed
    out.emit(
        {"event": "summary", "found": len(roots), "removed": removed, "freed_bytes": freed, "left": left}
    )
    if not out.json:
        if not roots:
            out.info("no orphaned RAM tiers")
        elif remove:
            out.info(f"removed {removed}, freed {_size(freed)}")
        elif left and left == len(roots):
            out.info("remove them with: rq cache orphans --remove")
        elif left:
            # --remove never takes an unclaimed root (an older rq's): "remove them" promised it
            out.info(f"remove the {left} that are not unclaimed with: rq cache orphans --remove")
