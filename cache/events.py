"""Typed progress events the cache library reports through a callback (rqcli draws them)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Planned:
    objects: int  # to fetch
    bytes: int
    skipped: int  # already cached at the same version
    skipped_bytes: int


@dataclass(frozen=True)
class WouldFetch:
    """A dry run's plan, one object at a time as the listing is checked: a prefix of millions is
    reported without a list of them in memory."""

    url: str
    size: int


@dataclass(frozen=True)
class Progress:
    bytes: int  # total bytes received so far in this run


@dataclass(frozen=True)
class Landed:
    url: str
    size: int


@dataclass(frozen=True)
class Failed:
    url: str
    kind: str  # not_found | auth | unreachable | verify | no_space | origin | changed
    message: str
    # what was raised, when it is what `kind` says: a one-object call raises it again, subclass
    # and `hint` included (a misbehaving store's OriginError must not read "re-run to continue")
    error: BaseException | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Retrying:
    url: str
    attempt: int
    delay_s: float
    reason: str


@dataclass(frozen=True)
class ServedStale:
    """`Cache.open` or `Cache.path` served a cached copy without being able to ask the origin
    whether it is still current (the store refused the connection, timed out, or kept answering
    5xx). The bytes are the verified copy of the version last confirmed `checked_s` seconds ago."""

    url: str
    checked_s: float
    reason: str  # the error that kept the origin from answering


@dataclass(frozen=True)
class Demoted:
    """An object asked for in the RAM tier landed in the disk tier instead: the RAM tier's file
    system was full (ENOSPC below rq's cap: others' files) and evicting the RAM tier's LRU entries
    could not free enough. Reported just before its `Landed`; a read through `Cache.open` is served
    from the disk copy. A promotion of a disk entry into RAM that meets the same full file system
    is reported too (no `Landed`: it stays where it was). RAM entries that evictions move to disk
    are not reported one by one."""

    url: str
    size: int
    tier: str  # where it landed ("disk")
    reason: str  # the file system error that kept it out of RAM


@dataclass(frozen=True)
class Damaged:
    """`Cache.open` found the cached copy of `url` at `path` damaged: its bytes no longer match the
    digest recorded when it landed (the landing had verified them, so something changed them
    since: a failing disk, a process writing into the cache), or they could not be read back (EIO).
    The copy is dropped, never served, and the read goes on to the origin (its outcome is the
    caller's: good bytes, or the store's error). The disk under the cache deserves a look: `rq
    cache verify` checks every entry."""

    url: str
    path: str  # the damaged file, gone now
    reason: str


@dataclass(frozen=True)
class Ignored:
    """A key the store listed that is not one of the source's objects: outside the prefix asked
    for, or listed a second time. S3 sends neither; it is not fetched (a store or proxy that
    misbehaves). The first few of each source are reported; `PreloadResult.ignored` counts all."""

    url: str
    reason: str


Event = (
    Planned | WouldFetch | Progress | Landed | Failed | Retrying | ServedStale | Demoted | Damaged | Ignored
)
EventSink = Callable[[Event], None]


def ignore(_: Event) -> None:
    """The default sink."""
