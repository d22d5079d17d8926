"""Crash-consistent small-file writes: temp name in the same directory, fsync, rename, fsync dir."""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

from topics.errors import PermissionDenied, TopicError

SHARED_DIR = 0o755  # what rq makes for a topic: others may read it (segments are 0644), never write


def make_dirs(path: Path) -> None:
    """`mkdir -p path`, every directory it makes at most 0755 whatever the umask: a plain mkdir
    under umask 000 made the data dir, the topic and its groups/ 0777, and whoever can write a
    directory can replace what is in it (a group's offset, a segment). Readable by others as the
    topic's files are. Directories that are there already are left as they are. Raises OSError as
    mkdir does. (transfer/private.py and cache/layout.py hold their own, 0700: a cache and
    secrets are one user's; the libraries import no other.)"""
    missing = []
    for component in (path, *path.parents):
        if os.path.lexists(component):
            break
        missing.append(component)
    for component in reversed(missing):
        try:
            os.mkdir(component, SHARED_DIR)  # the umask only takes bits away
        except FileExistsError:
            continue  # made meanwhile by another writer: theirs to set


class RenamedNotSynced(OSError):
    """write_atomic's rename was done, so every reader now sees the new file, but the fsync of its
    directory failed: whether the rename survives a power cut is unknown (a crash may bring the old
    file back). errno and strerror are the fsync's, filename the file written. An OSError still,
    so a caller that only knows OSError fails as before; one that can say what readers see (a
    group's commit: the new offset) catches it first."""


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Replaces `path` with `data` whole: readers see the old file or the new one, never a mix.
    Raises OSError (named for `path`) when nothing changed; RenamedNotSynced when the new file is
    in place (readers see it) but syncing the directory failed, so a power cut may undo it."""
    # A temp name of its own per call, not per process: two threads (or two processes of one pid
    # in different pid namespaces) writing the same file at once each rename a whole file of their
    # own, and the last rename wins; with one name per pid one truncated the other's temp file
    # under it (a torn or empty group file) and the other's rename found it gone.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(6).hex()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as exc:
        # a full disk must not leave a half-written temp file behind
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and (exc.filename is None or os.fspath(exc.filename) == os.fspath(tmp)):
            # named for the file being written, not the temp name nobody asked for (an fsync on a
            # full disk named none: "No space left on device", which file?)
            raise type(exc)(exc.errno, exc.strerror, os.fspath(path)) from None
        raise
    try:
        fsync_dir(path.parent)
    except OSError as exc:
        # past the rename: the new file is what everyone reads now; only its durability failed
        raise RenamedNotSynced(exc.errno, exc.strerror, os.fspath(path)) from None


def not_writable(what: str, exc: OSError) -> TopicError | None:
    """An OSError that says rq may not write `what` (a topic, a group's offset) -> one line that
    names the file and the fix; None for anything else (a full disk stays an OSError: exit 7)."""
    name = os.fsdecode(exc.filename) if exc.filename else ""
    where = f"{name}: " if name and not what.endswith(f" {name}") else ""  # the topic's own dir: once
    if exc.errno in (errno.EACCES, errno.EPERM):
        return PermissionDenied(
            f"cannot write {what}: {where}{exc.strerror}; run as a user that may write there, or name another path"
        )
    if exc.errno == errno.EROFS:
        return TopicError(f"cannot write {what}: {where}read-only file system; name another path")
    return None
