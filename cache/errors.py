"""The cache library's exception hierarchy: one base, one subclass per way a caller must react."""

from __future__ import annotations


class CacheError(Exception):
    """Base of every error the cache library raises on purpose."""


class BadSourceError(CacheError, ValueError):
    """A URL, path or argument rq cannot use (wrong scheme, empty bucket name, a size that is not
    one, a URL that is not text, …). Also a ValueError, as the bad value it is."""


class ReadOnlyCacheError(BadSourceError):
    """A change asked of a cache whose index could be opened only for reading (its file system is
    read-only, or its directory is not writable by this user): reading it works, changing it does
    not. A BadSourceError (rq: exit 2), as for a cache dir that cannot be made."""


class NotFoundError(CacheError):
    """The bucket, key, directory or cache entry does not exist."""


class AuthError(CacheError):
    """Missing, wrong or insufficient credentials."""


class TlsError(AuthError):
    """The store's TLS certificate is not trusted (a private CA that AWS_CA_BUNDLE does not name, a
    certificate for another host name, an expired one); `hint` says which fix fits."""

    hint = "a private CA? point AWS_CA_BUNDLE at its certificates"


class DeniedError(CacheError):
    """One object the origin will not let us read (a local file or directory without read
    permission): it fails alone and the others go on, unlike AuthError's wrong credentials."""


class UncacheableError(CacheError):
    """A file whose contents cannot be captured faithfully: a /proc or /sys pseudo-file states a
    size of 0 and reads back text made up anew on every read. It fails alone, without retries."""


class UnreachableError(CacheError):
    """The origin could not be reached, or the connection was lost and retries ran out."""


class OriginError(CacheError):
    """The origin answered with an error that retries did not cure (5xx, throttling, bad reply)."""


class MisbehavingStoreError(OriginError):
    """The store answered in a way S3 never does (a listing that repeats its own continuation
    token, a reply without an ETag): retrying or re-running meets the same reply. `hint` says so."""

    hint = "the store (or a proxy in front of it) is misbehaving; a re-run would meet the same reply"


class RamTierUnavailableError(CacheError):
    """The RAM tier was asked for where this machine has none usable (/dev/shm missing, read-only
    or not ours to write); the disk tier works without it. rq: exit 10, "needs something this
    machine lacks"."""


class ThreadLimitError(CacheError):
    """A thread the cache needs could not start (RuntimeError "can't start new thread": the
    address-space limit, ulimit -v, leaves no room for its stack, or ulimit -u / the cgroup's pids
    limit is reached) and the work cannot go on without it."""


class VerifyError(CacheError):
    """Data did not match its size, checksum or recorded digest, or a cached copy could not be
    read back to be checked (EIO: a failing disk; then `hint` says so). Such a copy is never
    served: Cache.open drops it and fetches the object again."""

    hint: str | None = None


class ChangedError(VerifyError):
    """The origin object changed while it was being read (its version moved under us)."""


class CacheFullError(CacheError):
    """A tier cap cannot be honoured (nothing evictable) or the file system is full."""


class FileSystemFullError(CacheFullError):
    """The file system under a tier ran out of space (ENOSPC/EDQUOT) below the tier's cap: room
    taken by files that are not the cache's, or a cap set above what the file system holds. Its
    message begins "no space left". A RAM-tier landing that meets it evicts, then lands on disk
    (docs/cache.md, "A full RAM file system")."""


class BusyError(CacheError):
    """Another process is fetching the same big object right now; try again shortly."""


class UnsafeDirError(CacheError):
    """A cache or RAM-tier directory rq must not adopt: not a cache yet not empty, another user's,
    a symlink, or writable by others (its sweeps would delete files that are not rq's)."""


# The kind each error is reported as (the `kind` of a {"event":"failed"} line), subclasses first.
KINDS: tuple[tuple[type[CacheError], str], ...] = (
    (NotFoundError, "not_found"),
    (DeniedError, "denied"),
    (UncacheableError, "uncacheable"),
    (AuthError, "auth"),
    (UnreachableError, "unreachable"),
    (ChangedError, "changed"),
    (VerifyError, "verify"),
    (CacheFullError, "no_space"),
    (BusyError, "busy"),
    (OriginError, "origin"),
)


def error_kind(exc: BaseException) -> str:
    """The failure kind `exc` is reported as ("error": none of the documented ones)."""
    return next((kind for cls, kind in KINDS if isinstance(exc, cls)), "error")


def error_for(kind: str, message: str, raised: BaseException | None = None) -> CacheError:
    """A failure of one object (its kind and message) as the exception a one-object call
    (Cache.open, `rq cache cat`) raises: the class of that kind, so the exit code is the one
    rq preload gives the same failure (docs/cache.md, "Exit codes"); CacheError for the rest.
    `raised`, the error the fetch met, is raised as is when it is of that kind (its subclass
    and `hint` say more than the kind does)."""
    if isinstance(raised, CacheError) and error_kind(raised) == kind and str(raised) == message:
        return raised
    if kind == "no_space" and message.startswith("no space left"):
        return FileSystemFullError(message)
    return next((cls(message) for cls, k in KINDS if k == kind), CacheError(message))
