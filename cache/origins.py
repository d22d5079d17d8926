"""Origins behind one small protocol: an S3 prefix, or a local / NFS directory.

An origin lists objects (with a version that changes when the object does), stats one object, and
fetches bytes into a Landing. The preloader and the read API never care which one they talk to.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from cache.directio import aligned_buffer
from cache.errors import (
    BadSourceError,
    CacheError,
    ChangedError,
    DeniedError,
    NotFoundError,
    OriginError,
    UncacheableError,
    UnreachableError,
)
from cache.landing import Checksums, Landing, ObjectInfo, clean_version

if TYPE_CHECKING:
    from cache.s3 import S3, Item, S3Settings

# cache.s3 (and the CRT behind it) is imported where an s3:// origin is first used: a directory
# origin (rq cache path of a local file, rq preload DIR) does not pay for it (~12 ms). Its at-fork
# handling comes with it, as it did: every S3 client is made there.

Done = Callable[[BaseException | None], None]
_MERGED_SLASHES = re.compile("/{2,}")


class Origin(Protocol):
    # True where a whole object's body sits in memory until it is written (the CRT's GETs): the
    # fetcher then bounds the bytes of such requests in flight (cache.fetcher.BODY_BUDGET)
    holds_bodies: bool

    def list(self) -> Iterator[ObjectInfo]: ...

    def stat(self, url: str) -> ObjectInfo: ...

    def checksums(self, info: ObjectInfo) -> Checksums: ...

    def fetch(self, info: ObjectInfo, landing: Landing, on_done: Done, piece: tuple[int, int] | None) -> Any:
        """Starts writing the object (or the inclusive byte range `piece`) into `landing`; calls
        `on_done(None | error)` once, from any thread. Returns something with .cancel(), or None."""
        ...


def s3_version(etag: str, size: int, version_id: str | None) -> str:
    return f"etag:{etag};size:{size}" + (f";vid:{version_id}" if version_id else "")


def same_version(a: str, b: str) -> bool:
    """Whether two versions of one object name the same bytes: equal, or S3 versions equal but for
    the version id, which a listing never gives and a HEAD or GET in a versioned bucket does (the
    copy a read landed, with one, was taken for superseded by the listing's, without: fetched
    again on every run, and dropped when that fetch failed)."""
    if a == b:
        return True
    if not (a.startswith("etag:") and b.startswith("etag:")):
        return False
    return a.split(";vid:", 1)[0] == b.split(";vid:", 1)[0]


class S3Origin:
    holds_bodies = True  # the CRT grows a buffer to each whole object's size before writing it

    def __init__(self, bucket: str, prefix: str, settings: S3Settings):
        self.bucket, self.prefix, self.settings = bucket, prefix, settings
        self._client: S3 | None = None
        # the key prefix asked for in ListObjectsV2: the source's own, or (cache.preload.list_prefix)
        # longer by the literal start of every --include pattern, as s5cmd and aws narrow it
        self.list_prefix = prefix
        # told of each key the listing gave that is not this source's object (outside the
        # prefix, or listed twice)
        self.on_ignored: Callable[[str, str], None] = lambda url, why: None

    @property
    def client(self) -> S3:
        # asked once per object: hashing the settings for the shared table each time cost ~5% of
        # a small-object preload's Python time (py-spy); a forked child still gets its own client
        client = self._client
        if client is None or client.pid != os.getpid():
            from cache.s3 import shared_client

            client = self._client = shared_client(self.settings)
        return client

    def list(self) -> Iterator[ObjectInfo]:
        return (info for info in self.marked() if info is not None)

    def marked(self) -> Iterator[ObjectInfo | None]:
        """list(), with None where each page of the store's listing ends (Listing.marked)."""
        return self.objects(self.client.listing(self.bucket, self.list_prefix).marked())

    def objects(self, items: Iterable[Item | None]) -> Iterator[ObjectInfo | None]:
        """The objects that listed items of this prefix stand for. `s3://b/dir/` lists everything
        under dir/. `s3://b/name` (no trailing slash) is the object `name` and whatever is under
        `name/`, like a path: never `name2` or `name.bak`, which a raw key prefix would take too
        (s5cmd and aws s3 cp take only the object; use --include for a pattern). Keys are
        relative to the prefix; the object itself is its base name, as a local file source is."""
        prefix = self.prefix
        exact = bool(prefix) and not prefix.endswith("/")
        # AWS keeps `a//b` as a key of its own; SeaweedFS merges the slashes and lists `a/b` for
        # the prefix `a//`. Such keys are kept as listed (never rewritten), and are relative to
        # the prefix as the store read it, so --include/--exclude and names see `b`, not `a/b`
        merged = _MERGED_SLASHES.sub("/", prefix)
        # keys listed lately: a store that lists a key twice (a page handed out again under a new
        # token) must not have it fetched and counted twice. Two pages' worth, not every key: a
        # listing of millions must not grow a set of them all (issue 3: memory stays bounded)
        recent: set[str] = set()
        older: set[str] = set()
        for item in items:
            if item is None:
                yield None  # (a page ended)
                continue
            key, size, etag, vid = item
            if key.endswith("/") and size == 0:
                continue  # a "folder" marker, not data
            if key.startswith(self.prefix):
                prefix = self.prefix
            elif key.startswith(merged):
                prefix = merged
            else:
                # S3 lists only keys under the prefix asked for: such a key is the store's (or a
                # proxy's) mistake, and not what the source names
                self._ignore(key, f"listed for s3://{self.bucket}/{self.prefix} but outside it")
                continue
            if key in recent or key in older:
                self._ignore(key, "listed twice by the store")
                continue
            recent.add(key)
            if len(recent) >= 2000:
                older, recent = recent, set()
            if not exact:
                rel = key[len(prefix) :].lstrip("/")
            elif key == prefix:
                rel = key.rsplit("/", 1)[-1]
            elif key.startswith(prefix + "/"):
                rel = key[len(prefix) + 1 :]
            else:
                continue  # a sibling that only shares the name's first characters
            yield ObjectInfo(f"s3://{self.bucket}/{key}", rel or key, size, s3_version(etag, size, vid), etag)

    def _ignore(self, key: str, why: str) -> None:
        self.on_ignored(f"s3://{self.bucket}/{key}", why)

    def stat(self, url: str) -> ObjectInfo:
        from cache.s3 import split_s3_url

        bucket, key = split_s3_url(url)
        size, etag, vid, _ = self.client.head(bucket, key)
        return ObjectInfo(url, key.rsplit("/", 1)[-1], size, s3_version(etag, size, vid), etag)

    def checksums(self, info: ObjectInfo) -> Checksums:
        """Whole-object checksums for a big object fetched in ranges (ranged replies carry none)."""
        from cache.s3 import split_s3_url

        bucket, key = split_s3_url(info.url)
        return Checksums.from_headers(self.client.head(bucket, key)[3])

    def fetch(self, info: ObjectInfo, landing: Landing, on_done: Done, piece: tuple[int, int] | None) -> Any:
        from cache.s3 import split_s3_url

        bucket, key = split_s3_url(info.url)
        if piece is None:
            # a whole object: the CRT writes the file itself (no Python per chunk, no GIL traffic);
            # Landing.finish hashes and verifies it by reading it back from the page cache, and
            # counts its bytes then (the CRT's progress callback comes once, with the whole body,
            # as the request ends: one more GIL hand-off per object for nothing)
            return self.client.get(
                bucket,
                key,
                on_headers=landing.on_headers,
                on_done=on_done,
                recv_filepath=landing.external_file(),
                size=info.size,
            )

        # a big object's piece: read into an aligned buffer and written from it (cache.ranged)
        def sink(view: memoryview, offset: int) -> None:
            landing.write(view, offset, inline=True)

        return self.client.ranged.start(bucket, key, piece, info.etag, sink, on_done)


def local_version(st: os.stat_result) -> str:
    """A directory entry's version, as git's index keeps it: size and mtime, and also the inode
    and ctime. A same-size rewrite within one mtime tick (whole seconds on FAT, ext4 with 128-byte
    inodes, NFSv3, older kernels) keeps size and mtime, but a file renamed over the old one has
    another inode, and any write or rename moves ctime."""
    return f"mtime:{st.st_mtime_ns};size:{st.st_size};ino:{st.st_ino};ctime:{st.st_ctime_ns}"


class _Cancelled(OriginError):
    """The fetcher gave a local copy up (the run is failing); reported through on_done."""


class _LocalRequest:
    """What LocalOrigin.fetch returns: something the fetcher can cancel (as cache.ranged's
    requests; that module is not imported here: http.client and ssl would come with it)."""

    cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


# how long a listing waits for a descriptor to open the next directory (the fetch frees its own as
# landings are published); past this, "cannot list …: Too many open files" ends the run as before
LIST_FD_PATIENCE = 30.0


def _scandir_sorted(path: Path) -> list[os.DirEntry[str]]:
    """The entries of `path` by name. Out of descriptors (EMFILE/ENFILE), it waits and tries again:
    the run's own landings hold descriptors until their batch is published, so under a low
    open-files limit a listing that opened its next directory at the wrong moment ended the whole
    run, however low --workers was (pk: ulimit -n 64, 5,000 files in 50 directories, 1 run in 2)."""
    deadline = time.monotonic() + LIST_FD_PATIENCE
    pause = 0.01
    while True:
        try:
            return sorted(os.scandir(path), key=lambda e: e.name)
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE) or time.monotonic() > deadline:
                raise
        time.sleep(pause)
        pause = min(0.5, pause * 2)


class LocalOrigin:
    """A directory (local disk, NFS, a FUSE mount). Copies run in a thread pool: read/pwrite release
    the GIL, and NFS latency wants several in flight."""

    holds_bodies = False  # copied in 4 MiB reads

    _pool: ThreadPoolExecutor | None = None
    _pool_pid = 0
    _pool_lock = threading.Lock()
    CHUNK = 4 << 20

    def __init__(self, root: Path, workers: int = 16):
        self.root = root
        self.workers = workers
        self.skip_dirs: frozenset[tuple[int, int]] = frozenset()  # (st_dev, st_ino) not to descend into
        self.as_dir = False  # named with a trailing `/`: a directory, never a file
        self._tls = threading.local()

    @classmethod
    def pool(cls, workers: int) -> ThreadPoolExecutor:
        with cls._pool_lock:
            if cls._pool is None or cls._pool_pid != os.getpid():
                cls._pool = ThreadPoolExecutor(max(1, workers), thread_name_prefix="rq-local")
                cls._pool_pid = os.getpid()
            return cls._pool

    def list(self) -> Iterator[ObjectInfo]:
        try:
            root_st = os.stat(self.root)
        except (FileNotFoundError, NotADirectoryError):
            raise NotFoundError(f"directory not found: {self.root}") from None
        except PermissionError as exc:
            # a directory above it rq may not search: denied (exit 4), not "cannot list" (exit 1)
            raise DeniedError(f"cannot read {self.root}: {exc.strerror}") from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise NotFoundError(f"directory not found: {self.root} (a symlink loop)") from None
            if exc.errno == errno.ENAMETOOLONG:
                raise BadSourceError(_too_long(self.root, exc)) from None
            raise (_unreachable(exc, self.root) or exc) from None
        # a file of the cache (its index, a blob) is refused as its directories are
        self._check_not_own(self.root)
        if stat.S_ISREG(root_st.st_mode) and self.as_dir:
            raise NotFoundError(
                f"no files under {self.root}/: {self.root} is a file, not a directory (drop the trailing /)"
            )
        if stat.S_ISREG(root_st.st_mode):
            yield ObjectInfo(str(self.root), self.root.name, root_st.st_size, local_version(root_st))
            return
        if not stat.S_ISDIR(root_st.st_mode):
            raise NotFoundError(f"not a regular file or directory: {self.root}")
        stack = [self.root]
        while stack:
            here = stack.pop()
            try:
                items = _scandir_sorted(here)
            except (FileNotFoundError, NotADirectoryError):
                if here == self.root:
                    raise NotFoundError(f"directory not found: {self.root}") from None
                continue  # removed (or replaced) since its parent was read, as a file may be
            except PermissionError as exc:
                if here == self.root:
                    raise DeniedError(f"cannot read directory {here}: {exc.strerror}") from None
                yield self._problem(here, f"cannot read directory {here}: {exc.strerror}", "/")
                continue
            except OSError as exc:
                if here != self.root and exc.errno == errno.ELOOP:
                    # replaced by a symlink loop since its parent was read: a symlink, which the
                    # walk skips (it stopped the whole run: "cannot list SRC: Too many levels of
                    # symbolic links", exit 1)
                    continue
                if here == self.root or exc.errno != errno.ENAMETOOLONG:
                    raise (_unreachable(exc, here) or exc) from None
                # one directory too deep to open by its path (a tree deeper than PATH_MAX) fails
                # alone, like an unreadable file (cp -r goes on too)
                yield self._problem(here, _too_long(here, exc, "directory "), "/", "bad_name")
                continue
            subdirs: list[Path] = []
            # each name's URL and key from its directory's, worked out once per directory:
            # os.path.relpath and abspath per file were ~60% of a listing's time
            base = os.path.abspath(here)
            prefix = "" if here == self.root else os.path.relpath(here, self.root).replace(os.sep, "/") + "/"
            for item in items:
                try:
                    # (an lstat only where the file system gives no type with the name: DT_UNKNOWN)
                    if item.is_dir(follow_symlinks=False):
                        if not self._skipped(item):
                            subdirs.append(Path(item.path))
                        continue
                    if not item.is_file(follow_symlinks=True):
                        continue
                    st = item.stat(follow_symlinks=True)
                except (FileNotFoundError, NotADirectoryError):
                    continue  # removed since the directory was read: nothing to cache
                except OSError as exc:
                    if exc.errno == errno.ELOOP:
                        continue  # a symlink loop leads nowhere, like a dangling link (skipped too)
                    if isinstance(exc, PermissionError) and not _searchable(here):
                        # a directory rq may list (r) but not search (no x): nothing in it can be
                        # opened. It fails as one, as an unreadable directory does, and --include
                        # is not asked to weigh each of its names
                        yield self._problem(here, f"cannot search directory {here}: {exc.strerror}", "/")
                        subdirs = []
                        break
                    if isinstance(exc, PermissionError):
                        # a symlink into a directory rq may not read: this name fails alone, the
                        # walk goes on (it stopped the whole run: "cannot read …: Permission
                        # denied", exit 1)
                        yield self._problem(item.path, f"cannot read {item.path}: {exc.strerror}")
                        continue
                    if exc.errno == errno.ENAMETOOLONG:
                        # a path too long to open fails alone too, saying so (it read as if rq
                        # were refused: "cannot read …: File name too long")
                        yield self._problem(item.path, _too_long(item.path, exc), kind="bad_name")
                        continue
                    raise _unreachable(exc, item.path) or CacheError(
                        f"cannot read {item.path}: {exc.strerror}"
                    ) from None
                yield ObjectInfo(
                    os.path.join(base, item.name), prefix + item.name, st.st_size, local_version(st)
                )
            stack.extend(subdirs)

    def _problem(self, path: str | Path, problem: str, slash: str = "", kind: str = "denied") -> ObjectInfo:
        """What the walk found and cannot offer: reported as a failure of its own (of `kind`: a
        path too long to open is a `bad_name`, not a refusal), never fetched."""
        rel = os.path.relpath(path, self.root).replace(os.sep, "/") + slash
        return ObjectInfo(os.path.abspath(path) + slash, rel, 0, "", problem=problem, problem_kind=kind)

    def _check_not_own(self, root: Path) -> None:
        """Refuses a source that is the cache's own directory or inside it: its index and blobs
        change as they are copied, and each run would cache the last run's copies again."""
        if not self.skip_dirs:
            return
        # and the directories it leads to through symlinks: a symlink to the cache's objects/
        # named a source whose own parents are not the cache's
        real = Path(os.path.realpath(root))
        for d in (root, *root.parents, *((real, *real.parents) if real != root else ())):
            try:
                st = os.stat(d)
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in self.skip_dirs:
                raise BadSourceError(
                    f"{root} is inside this cache's own directory {d}: it cannot be preloaded"
                )

    def _skipped(self, item: os.DirEntry[str]) -> bool:
        if not self.skip_dirs or not any(item.inode() == ino for _, ino in self.skip_dirs):
            return False  # (the inode comes with the directory listing: no stat for the common case)
        try:
            st = item.stat(follow_symlinks=False)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) in self.skip_dirs

    def checksums(self, info: ObjectInfo) -> Checksums:
        return Checksums()

    def stat(self, url: str) -> ObjectInfo:
        try:
            st = os.stat(url)
        except (FileNotFoundError, NotADirectoryError):
            raise NotFoundError(f"not found: {url}") from None
        except PermissionError as exc:
            raise DeniedError(f"cannot read {url}: {exc.strerror}") from None
        except OSError as exc:
            if exc.errno == errno.ENAMETOOLONG:
                raise BadSourceError(_too_long(url, exc)) from None
            if exc.errno in _NOT_A_FILE:
                raise NotFoundError(f"not a regular file rq can open: {url}: {exc.strerror}") from None
            raise _unreachable(exc, url) or CacheError(f"cannot stat {url}: {exc.strerror}") from None
        if not stat.S_ISREG(st.st_mode):
            raise NotFoundError(f"not a regular file: {url}")
        return ObjectInfo(url, os.path.basename(url), st.st_size, local_version(st))

    def fetch(
        self, info: ObjectInfo, landing: Landing, on_done: Done, piece: tuple[int, int] | None
    ) -> _LocalRequest | None:
        """Queues the copy on the pool. The returned request's cancel() (the run is failing, or
        Ctrl-C) makes a copy not started yet end at once, and one under way end at its next
        chunk, each through on_done(Cancelled): before, a halted run went on copying every
        object it had queued (up to the window, 256), minutes from a slow NFS server."""
        req = _LocalRequest()

        def run() -> None:
            try:
                if req.cancelled:
                    raise _Cancelled(f"{info.url}: cancelled")
                self._tls.req = req  # (seen by _copy between chunks)
                try:
                    self._copy(info, landing, piece)
                finally:
                    self._tls.req = None
            except BaseException as exc:
                on_done(exc)
            else:
                on_done(None)

        try:
            self.pool(self.workers).submit(run)
        except BaseException:
            # submit() queues the call before it starts a thread for it: one that cannot start
            # ("can't start new thread") raises here, and a thread the pool already has would run
            # the copy later, after the failure was reported, into a landing the fetcher has
            # given up. Cancelled, it does no file work when it runs
            req.cancelled = True
            raise
        return req

    def _copy(self, info: ObjectInfo, landing: Landing, piece: tuple[int, int] | None) -> None:
        req: _LocalRequest | None = getattr(self._tls, "req", None)
        view: memoryview | None = getattr(self._tls, "buf", None)
        if view is None:
            # page-aligned and reused: a big file's pieces go to disk from this very buffer
            view = self._tls.buf = aligned_buffer(self.CHUNK)
        # before the open: a change from this moment on, within the file system's timestamp
        # tick, could leave its stat as it was (Landing.finish then marks the entry racy)
        read_at = time.time_ns()
        try:
            # O_NONBLOCK: a name that became a FIFO since it was listed must not block this
            # thread forever waiting for a writer (no effect on a regular file's reads); O_NOCTTY:
            # one that became a terminal must not become this process's controlling terminal
            fd = os.open(info.url, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
        except (FileNotFoundError, NotADirectoryError):
            raise NotFoundError(f"not found: {info.url}") from None
        except PermissionError as exc:
            raise DeniedError(f"cannot read {info.url}: {exc.strerror}") from None
        except OSError as exc:
            if exc.errno in _NOT_A_FILE:
                # the name became a socket or a device without a driver (ENXIO, ENODEV), a symlink
                # loop, or a path too long to open since it was listed: this file fails alone. (They
                # were UnreachableError, which stops the whole run: exit 6, "re-run to continue")
                raise NotFoundError(f"cannot open {info.url} as a regular file: {exc.strerror}") from None
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                # this process's open-files limit, not the origin: the fetcher backs off and
                # retries with fewer in flight (the cause names the limit if it still fails)
                raise OriginError(f"cannot open {info.url}: {exc.strerror}") from exc
            raise UnreachableError(f"cannot open {info.url}: {exc.strerror}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise NotFoundError(f"not a regular file any more: {info.url}")
            if local_version(st) != clean_version(info.version):
                raise ChangedError(f"{info.url} changed since it was listed")
            landing.note_read(read_at)
            start, end = piece if piece else (0, info.size - 1)
            offset = start
            while offset <= end:
                if req is not None and req.cancelled:
                    raise _Cancelled(f"{info.url}: cancelled")
                try:
                    n = os.preadv(fd, [view[: min(self.CHUNK, end + 1 - offset)]], offset)
                except OSError as exc:
                    if exc.errno == errno.EIO:
                        raise  # (a bad block of this file fails it alone; a re-run would meet it too)
                    raise _unreachable(exc, info.url) or exc from None
                if n == 0:
                    break
                landing.write(view[:n], offset, inline=True)
                offset += n
            if info.size == 0 and os.pread(fd, 1, 0):
                # /proc and /sys files say 0 bytes and yet read back text that changes per read
                raise UncacheableError(
                    f"{info.url} says it holds 0 bytes yet reads back data (a /proc or /sys file?)"
                )
            if local_version(os.fstat(fd)) != clean_version(info.version):
                raise ChangedError(f"{info.url} changed while it was copied")
        finally:
            os.close(fd)


# open()/stat() errors that say the name is no regular file rq can read, not that the origin failed
_NOT_A_FILE = frozenset({errno.ENXIO, errno.ENODEV, errno.ELOOP, errno.ENAMETOOLONG})


# the longest path the kernel opens, with its terminating NUL (Linux's PATH_MAX)
PATH_MAX = 4096


def _too_long(path: str | os.PathLike[str], exc: OSError, what: str = "") -> str:
    """The message of an ENAMETOOLONG: which limit the path broke, and what to do about it (rq
    opens files by their full path)."""
    size = len(os.fsencode(path))
    if size >= PATH_MAX:
        why = f"its path is {size} bytes, over the {PATH_MAX - 1} the kernel opens (PATH_MAX)"
        fix = "move it, or rename the directories above it, to a shorter path"
    else:  # (a name over the file system's NAME_MAX, 255 bytes on most)
        why = "a name in its path is longer than the file system allows (NAME_MAX)"
        fix = "rename it"
    return f"cannot open {what}{os.fspath(path)}: {exc.strerror} ({why}); {fix} to cache it"


def _searchable(directory: str | Path) -> bool:
    """Whether names in `directory` can be looked up (search permission: `.` in it can be)."""
    try:
        os.stat(os.path.join(directory, "."))
    except PermissionError:
        return False
    except OSError:
        pass
    return True


# errors of a network or FUSE file system that went away (its daemon died, the server is down or
# timed out, a handle went stale), or of the device under it (EIO): the origin could not be asked,
# as for a store that cannot be reached. (They were a plain CacheError, exit 1: "cannot stat …")
_UNREACHABLE = frozenset(
    {
        errno.ENOTCONN,
        errno.ETIMEDOUT,
        errno.EHOSTDOWN,
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
        errno.ECONNREFUSED,
        errno.ECONNRESET,
        errno.ECONNABORTED,
        errno.ESTALE,
        errno.EIO,
    }
)


def _unreachable(exc: OSError, path: str | os.PathLike[str]) -> UnreachableError | None:
    """`exc` as the UnreachableError it means for a directory origin, or None."""
    if exc.errno not in _UNREACHABLE:
        return None
    err = UnreachableError(
        f"cannot reach {os.fspath(path)}: {exc.strerror} (a network or FUSE file system that went away?)"
    )
    err.hint = "check that its file system is mounted and its server or daemon runs; re-run to continue"  # type: ignore[attr-defined]
    return err


def _check_not_a_mistyped_url(text: str) -> None:
    """`s3:/bucket/x` or `s3:bucket/x` is a URL with a slash missing, not a relative directory
    named `s3:` (unless one exists): say so instead of "directory not found"."""
    scheme, colon, rest = text.partition(":")
    if colon and scheme.lower() in _URL_SCHEMES and not rest.startswith("//") and not os.path.lexists(text):
        raise BadSourceError(f"malformed URL {text!r}: did you mean {scheme}://{rest.lstrip('/')}?")


_URL_SCHEMES = frozenset({"s3", "file", "http", "https", "gs", "az", "abfs", "hf"})


def _check_not_blank(text: object) -> None:
    """An empty SOURCE (`rq preload "$UNSET"`) would be the current directory, and one of only
    spaces a file named so: refuse both, as `cp` and `rq send` refuse "", before anything is read
    or created. Spaces are taken only as a name that exists (a file may be named " ")."""
    if not isinstance(text, str):
        raise BadSourceError(f"a URL or path must be text (str), not {type(text).__name__}")
    if not text:
        raise BadSourceError("empty URL or path (an unset variable?)")
    if not text.strip() and not os.path.lexists(text):
        raise BadSourceError("a URL or path of only white space (an unset variable?)")


def parse_source(text: str, settings: S3Settings) -> S3Origin | LocalOrigin:
    _check_not_blank(text)
    _check_not_a_mistyped_url(text)
    if text.startswith("s3://"):
        from cache.s3 import split_s3_url

        bucket, prefix = split_s3_url(text)
        return S3Origin(bucket, prefix, settings)
    if "://" in text:
        raise BadSourceError(f"unsupported URL scheme in {text!r} (use s3://bucket/prefix/ or a directory)")
    origin = LocalOrigin(Path(os.path.abspath(text)))
    # `dir/file.bin/` names a directory, as for cp, ls and the kernel (ENOTDIR), and as
    # `s3://b/key.bin/` names a prefix: a file there is not taken (pathlib drops the slash)
    origin.as_dir = text.endswith(("/", os.sep))
    return origin


def origin_for_url(url: str, settings: S3Settings) -> S3Origin | LocalOrigin:
    """The origin that can stat and fetch one cached URL."""
    if url.startswith("s3://"):
        from cache.s3 import split_s3_url

        bucket, _ = split_s3_url(url)
        return S3Origin(bucket, "", settings)
    return local_origin_for_url(url)


def local_origin_for_url(url: str) -> LocalOrigin:
    """The origin of one cached local URL (a path): origin_for_url's without S3 settings."""
    return LocalOrigin(Path(os.path.dirname(url) or "/"))


def normalise_url(url: str | os.PathLike[str]) -> str:
    """Cache keys: s3:// URLs as given, local paths made absolute (no symlink resolution); a
    `pathlib.Path` is the path it names. Raises BadSourceError for another scheme (it is not a
    relative path named `http:`) and for a name that is not UTF-8 (the index keys entries by URL
    text)."""
    if isinstance(url, os.PathLike):
        url = os.fspath(url)  # (a bytes path stays bytes, and is refused below as before)
    _check_not_blank(url)
    _check_not_a_mistyped_url(url)
    scheme, sep, rest = url.partition("://")
    if sep and scheme.lower() == "s3":
        return f"s3://{rest}"
    if sep and scheme.lower() == "file":
        url = rest
    elif sep and "/" not in scheme:
        raise BadSourceError(f"unsupported URL scheme {scheme!r} in {url!r}: use s3:// or a local path")
    try:
        url.encode("utf-8")
    except UnicodeEncodeError:
        shown = url.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        raise BadSourceError(f"file name is not valid UTF-8: {shown}") from None
    return os.path.abspath(url)


def normalise_pattern(pattern: str) -> str:
    """An `rq cache ls/evict/pin/verify` pattern in the form of the URLs it is matched against: a
    local path absolute (keeping a trailing `/`, which means "everything under")."""
    if "://" in pattern and not pattern.lower().startswith("file://"):
        return normalise_url(pattern)
    slash = "/" if pattern.endswith("/") else ""
    return normalise_url(pattern).rstrip("/") + slash
