"""The topics library's exceptions: one small hierarchy callers can map to exit codes."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any


class TopicError(Exception):
    """Base of every error the topics library raises."""


class SpecError(TopicError, ValueError):
    """A SPEC (offset/time position or range), expression, template or field list is malformed."""


class TopicNotFound(TopicError):
    """The topic, stream or log directory does not exist."""


class SubjectNotTaken(TopicNotFound):
    """A JetStream subject filter the stream holds nothing on and whose subjects take none of it (a
    typo in the subject): nothing would ever be read."""


class SpecFileNotFound(TopicNotFound):
    """A saved replay spec (`--spec FILE`) does not exist: a file not found, as rq's other missing
    files are (exit 3), not a malformed spec."""


class SourceUnreachable(TopicError):
    """A server (NATS, MQTT) could not be reached or the connection was lost."""


class ProtocolViolation(TopicError):
    """The server broke its protocol: a frame larger than it said it allows, a line that never
    ends, a header block larger than its message, a reply of the wrong shape. rq stops reading
    (nothing of it is buffered past a bound) and closes the connection. The server was reached
    and answered, so this is a failure of the operation (exit 1), not an outage (exit 6)."""


class NoResponders(SourceUnreachable):
    """JetStream is not there for rq's account: a JetStream API request answered 503 'no
    responders' (nothing in the account listens on its subject), or the server said it is not
    enabled. The message says what to change, not to check the server is running."""


class ConnectionLost(SourceUnreachable):
    """A server rq was connected to (it answered) closed the connection, reset it, went silent or
    left a request unanswered: exit 6 as any unreachable server, but not with "is the server
    running?", which only fits a server that could not be reached at all (connection refused)."""


class CorruptRecord(TopicError):
    """A record or batch failed its CRC in the middle of the log (not a torn tail)."""

    def __init__(self, message: str, offset: int, segment: str, position: int):
        super().__init__(message)
        self.offset = offset
        self.segment = segment
        self.position = position


class Unsupported(TopicError):
    """The operation does not exist for this kind of source (e.g. replay of a live MQTT topic)."""


class DigestMismatch(TopicError):
    """A saved replay spec's digest or count does not match the data replayed now."""


class RecordTooLarge(TopicError):
    """A record is over what the target stores in one piece (refused before anything is written)."""


class WriterBusy(TopicError):
    """Another process holds the topic's writer lock."""


class DamagedGroup(TopicError):
    """A consumer group's stored offset cannot be read; `rq offsets reset` writes a new one."""


class CommitNotDurable(TopicError):
    """A group's commit whose new offset is stored and seen by every reader (the file's rename was
    done), but whose durability failed: syncing the directory after the rename raised `error` (an
    OSError, errno kept: EIO, ENOSPC, EROFS, ...), so a power cut may bring back the offset before.
    The commit is done as far as anyone reads: a caller counts `offset` as committed (a rerun
    starts there) and still reports the failure, naming `path`."""

    def __init__(self, group: str, offset: int, path: str, error: OSError):
        self.group, self.offset, self.path, self.error = group, offset, path, error
        self.errno = error.errno
        why = error.strerror or str(error) or type(error).__name__
        super().__init__(
            f"group {group} is committed at offset {offset} ({path}: readers see it), but syncing its "
            f"directory failed: {why}; a power cut may take it back to the offset before"
        )


class AccessDenied(TopicError):
    """The server refused rq's credentials (credentials=True), or rq refused the server's
    certificate (False; the message then names the fix)."""

    def __init__(self, message: str, credentials: bool = True, server: str = "nats"):
        super().__init__(message)
        self.credentials = credentials
        self.server = server  # "nats" or "mqtt": which settings the fix is in


class PermissionDenied(AccessDenied):
    """The file system refused rq a topic's own files (EACCES, EPERM: another user's topic, a
    directory rq may not write in, an immutable file). Exit 4, as a server's refused permission:
    the path is fine, the rights are missing."""

    def __init__(self, message: str):
        super().__init__(message, credentials=False, server="local")


class _StoredPart(BaseException):
    """What an append that stopped partway left stored: the batch's first `stored` records
    (offsets `first`..`last`; None for a target without offsets, MQTT), and `error`, what
    stopped it."""

    def __init__(self, url: str, first: int | None, last: int | None, stored: int, error: BaseException):
        self.url, self.first, self.last, self.stored, self.error = url, first, last, stored, error
        super().__init__(
            f"{url}: the first {stored} record(s) of the batch are stored (offsets {first}..{last}), "
            f"then: {str(error) or type(error).__name__}"
        )


class AppendedPartly(_StoredPart, TopicError):
    """An append stopped after part of its batch was stored: the embedded log splits a batch over
    its size limit into parts, each durable on its own, and a later part failed (a full disk).
    The batch's first `stored` records are stored (offsets `first`..`last`) and stay; `error` is
    what stopped the rest (an OSError keeps its errno). A caller that counts or commits what the
    target holds counts these: a rerun from the first record not stored duplicates nothing."""

    error: Exception


class AppendInterrupted(_StoredPart, KeyboardInterrupt):
    """A KeyboardInterrupt (Ctrl-C; `error` is the interrupt itself, e.g. a SIGTERM handler's
    subclass) that came while the embedded log was storing a batch, after some of it (`stored`
    records, all of them where it came after the last part's fdatasync) was durable. It stays a
    KeyboardInterrupt, so it stops what it stops; a caller that counts or commits what the target
    holds counts these, as for AppendedPartly. The log never holds a part it does not count: one
    cut short is truncated away, one whose bytes were all written is synced and counted."""

    error: KeyboardInterrupt


class PublishRefused(TopicError):
    """The server answered the publish of a record with a refusal (a stream's limits under discard
    policy `new`, a Nats-TTL or rollup the stream does not allow, ...). It is up: not an outage.

    `index` is the record's place in the append's batch (0-based). Records already on their way
    after it (`sent` records of the batch went out, none after them) that the server took are
    removed again (`removed` of them), so of the batch the topic keeps only the records before it
    and a rerun from the refused record neither skips nor duplicates any (an older message a
    stream dropped at its limits to make room for one of them stays gone); those that could not be removed
    (`why_kept` says why, e.g. a stream that denies deletes) stay stored. `appended` (a
    topics.sources.Appended) is what that append left stored: the records before it
    (`stored_before`), and those after it that stay. `str()` names the record by its place in the
    batch; `describe` words the same with the caller's names (its place in the input, its offset
    in the source)."""

    def __init__(
        self,
        url: str,
        index: int,
        reason: str,
        appended: Any,
        stored_before: int,
        sent: int,
        removed: int = 0,
        why_kept: str | None = None,
    ):
        self.url, self.index, self.reason = url, index, reason
        self.appended, self.stored_before, self.sent = appended, stored_before, sent
        self.removed, self.why_kept = removed, why_kept
        super().__init__(self.describe(lambda i: f"record {i + 1} of the batch", stored_before))

    @property
    def kept_after(self) -> int:
        """Records after the refused one that stay stored (they could not be removed)."""
        return int(self.appended.stored) - self.stored_before

    def describe(self, name: Callable[[int], str], stored_before: int) -> str:
        """One line: the refused record (`name(index)`), the server's reason, and what is stored
        around it (`stored_before`: the caller's count of records stored before it)."""
        after = self.sent - self.index - 1
        around = ""
        if after:
            around = f"; of the {after} sent after it before rq stopped (through {name(self.sent - 1)}), "
            if self.kept_after:
                around += (
                    f"{self.kept_after} stay stored (rq could not remove them: {self.why_kept}): "
                    "a rerun from the refused record stores them again"
                    + (f", {self.removed} were removed again" if self.removed else "")
                )
            elif self.removed:
                around += f"{self.removed} the stream took were removed again"
            else:
                around += "none was stored"
        return (
            f"the NATS server refused {name(self.index)}, published to {self.url}: {self.reason}; "
            f"{stored_before} record(s) before it are stored{around}; nothing later was sent"
        )


class PublishedElsewhere(PublishRefused):
    """The server stored a record in another stream than the URL's (`other`, named by its answer):
    the subject is captured there, not by the URL's stream `stream` (its subjects changed, or
    another stream took them, after rq checked). rq stops publishing and removes nothing: the
    records in `other` are not rq's to delete there (`elsewhere` of them went there), and the
    sequences of its answers are not the URL stream's. `at` is the first record stored elsewhere;
    `index` the first not stored in `stream` (a refusal before `at`, whose reason is `reason`, or
    `at`): what a rerun starts from. `appended` counts only what `stream` stored; those after
    `index` stay there too (a rerun stores them again)."""

    def __init__(
        self,
        url: str,
        stream: str,
        index: int,
        at: int,
        other: str,
        elsewhere: int,
        reason: str,
        appended: Any,
        stored_before: int,
        sent: int,
    ):
        self.stream, self.at, self.other, self.elsewhere = stream, at, other, elsewhere
        super().__init__(url, index, reason, appended, stored_before, sent)

    def describe(self, name: Callable[[int], str], stored_before: int) -> str:
        refused = (
            f"; {name(self.index)}, before it, was refused: {self.reason}" if self.index < self.at else ""
        )
        kept = (
            f", and {self.kept_after} after {name(self.index)} (a rerun from it stores them again)"
            if self.kept_after
            else ""
        )
        return (
            f"the NATS server stored {name(self.at)}, published to {self.url}, in stream {self.other}, "
            f"not in stream {self.stream}: {self.other} captures the subject, so a publish to it does not "
            f"reach {self.stream} (name a stream that takes the subject); {self.elsewhere} record(s) went to {self.other} and stay there (rq "
            f"removes nothing from another stream){refused}; {stored_before} record(s) before "
            f"{name(self.index)} are stored in {self.stream}{kept}; nothing later was sent"
        )


def as_int(value: object) -> int | None:
    """`value` as a plain int if it is an integer (an int, or anything with __index__: numpy's
    int64), else None: a bool, a float, a string."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        return None
    return operator.index(value)  # type: ignore[arg-type]


def offset_arg(what: str, value: object) -> int:
    """An offset given to the library (a start, a stop): an integer (as_int) of 0 or more,
    returned as a plain int. Anything else raises SpecError naming `what`, before anything is
    read or written."""
    number = as_int(value)
    if number is None or number < 0:
        raise SpecError(f"{what} must be an offset (an integer: offsets start at 0), not {value!r}")
    return number


def time_arg(what: str, value: object) -> int:
    """A time given to the library (a time bound, a time to seek to): Unix time in milliseconds as
    an integer (as_int; before 1970 is negative), within int64, returned as a plain int. A float
    (NaN too), a bool, a string or a datetime raises SpecError naming `what`, before anything is
    read: a datetime is converted by the caller (`int(dt.timestamp() * 1000)`), which says which
    time zone a naive one is in."""
    number = as_int(value)
    if number is None or not -(2**63) <= number < 2**63:
        hint = " (int(dt.timestamp() * 1000))" if hasattr(value, "timestamp") else ""
        raise SpecError(f"{what} must be Unix time in milliseconds (an int){hint}, not {value!r}")
    return number
