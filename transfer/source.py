"""The sender's files: scanning SOURCE arguments into manifest entries and reading chunks by offset."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import pwd
import signal
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from transfer import aligned, cachestat
from transfer.errors import (
    NameTooLongError,
    ResourceLimitError,
    SourceChangedError,
    SourceUnreadableError,
    TransferError,
    UnsafeNameError,
)
from transfer.manifest import FileEntry, Manifest, file_ident, file_key, make_manifest
from transfer.names import MAX_NAME_BYTES, descend, display_name, short_path, validate_name

T = TypeVar("T")


@dataclass(frozen=True)
class SourceFile:
    path: Path
    size: int
    mtime_ns: int
    inode: int
    # an in-place rewrite whose mtime was put back (touch -r) still moves the ctime
    ctime_ns: int
    dev: int

    def stamp(self) -> tuple[int, int, int, int, int]:
        """What tells this version of the file from any other during one run (the key leaves the
        device out: it changes when an NFS share is mounted again)."""
        return (self.size, self.mtime_ns, self.inode, self.ctime_ns, self.dev)


def _at(call: Callable[..., T], path: Path | str, *args: Any) -> T:
    """`call(path, *args)` (os.stat, os.lstat, os.open); for a path longer than PATH_MAX
    (ENAMETOOLONG), the same relative to its directory's descriptor (see _open_dir), as rsync
    reaches such files. Before, a file under a directory SOURCE whose absolute path was over
    PATH_MAX could not be stat'ed: it was skipped with a warning and `rq send` exited 0 without it."""
    try:
        return call(path, *args)
    except OSError as exc:
        if exc.errno != errno.ENAMETOOLONG:
            raise
    head, name = os.path.split(os.fspath(path))
    dfd = _open_dir(head)
    try:
        return call(name, *args, dir_fd=dfd)
    finally:
        os.close(dfd)


PIECE = 3072  # bytes of a long path opened at a time (PATH_MAX is 4096; a component at most 255)


def _open_dir(path: str) -> int:
    """A descriptor of directory `path`, however long: opened a piece of at most PIECE bytes at
    a time, each relative to the last (a directory whose absolute path is over PATH_MAX, deep in a
    SOURCE, could not be listed: `cannot list …: File name too long`, exit 3)."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
    if len(os.fsencode(path)) < PIECE:
        return os.open(path or ".", flags)
    pieces: list[str] = []
    rest = path
    while len(os.fsencode(rest)) >= PIECE:
        cut = rest.rfind("/", 0, PIECE)
        while cut > 0 and len(os.fsencode(rest[:cut])) >= PIECE:
            cut = rest.rfind("/", 0, cut)
        if cut <= 0:
            break  # no '/' early enough: one component past PIECE, let the kernel say so
        pieces.append(rest[:cut])
        rest = rest[cut + 1 :]
    pieces.append(rest)
    fd = os.open(pieces[0], flags)
    try:
        return descend(fd, [p for p in pieces[1:] if p], flags)
    finally:
        os.close(fd)


def _islink(path: str | Path) -> bool:
    try:
        return stat.S_ISLNK(_at(os.lstat, path).st_mode)
    except OSError:
        return False


def _identity(path: Path, st: os.stat_result | None = None) -> SourceFile:
    st = st or _at(os.stat, path)
    return SourceFile(path, st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns, st.st_dev)


@dataclass(frozen=True)
class Skipped:
    """An entry under a directory SOURCE that is not sent, and why."""

    path: Path
    reason: str


def scan(
    sources: list[Path],
    chunk_size: int,
    skipped: list[Skipped] | None = None,
    follow_symlinks: bool = False,
) -> tuple[Manifest, list[SourceFile]]:
    """A file argument is sent under its base name; a directory under its own name with its tree
    (like `cp -r`), empty directories included (manifest dirs). Symlinks to files are followed,
    except one out of SOURCE through a link someone else made (_outside; `follow_symlinks`
    follows those too); symlinked directories are walked only with `follow_symlinks`, and special
    files and broken symlinks never: each entry not sent is appended to `skipped`, so the caller can say so instead of dropping them silently."""
    found: dict[str, tuple[SourceFile, int]] = {}
    dirs: list[str] = []
    dir_mtimes: dict[str, int] = {}
    dir_modes: dict[str, int] = {}
    out = skipped if skipped is not None else []
    for src in sources:
        if not src.exists():
            raise FileNotFoundError(2, "source does not exist", str(src))
        base = src.resolve().name if src.name in ("", ".", "..") else src.name
        if src.is_dir():
            validate_name(base)  # an argument the user named is refused, not skipped
            _walk(src, base, found, out, dirs, (dir_mtimes, dir_modes), follow_symlinks)
        else:
            reason = _not_regular(src)
            if reason is not None:  # a FIFO (`<(tar c …)`) or a device would arrive as an empty file
                raise SourceUnreadableError(
                    f"{short_path(src)} is {reason}: rq sends regular files and directories"
                )
            _add(found, base, src)
    entries: list[FileEntry] = []
    for name, (sf, mode) in found.items():
        entries.append(
            FileEntry(
                name=name,
                size=sf.size,
                mode=mode,
                key=file_key(name, sf.size, sf.mtime_ns, sf.inode, chunk_size, ctime_ns=sf.ctime_ns),
                ident=file_ident(name, sf.size, sf.mtime_ns, sf.inode, ctime_ns=sf.ctime_ns),
                mtime_ns=sf.mtime_ns,
            )
        )
    manifest = make_manifest(chunk_size, entries, dirs, dir_mtimes, dir_modes)
    by_name = {name: sf for name, (sf, _) in found.items()}
    return manifest, [by_name[f.name] for f in manifest.files]


def _walk(
    src: Path,
    base: str,
    found: dict[str, tuple[SourceFile, int]],
    skipped: list[Skipped],
    empty_dirs: list[str],
    dir_meta: tuple[dict[str, int], dict[str, int]],
    follow_symlinks: bool = False,
) -> None:
    """Adds the files under directory `src` to `found`, the directories with none under them to
    `empty_dirs`, and the mtime and permission bits of every directory sent (either way) to
    `dir_meta` (mtimes, modes)."""
    sent_under: set[Path] = set()  # directories that get a file (they arrive as its parents)
    walked: list[Path] = []
    inside = _real_dir(src)
    for root, dirs, files, links, ancestry in _tree(src):
        dirs.sort()
        walked.append(Path(root))
        for dname in list(dirs):
            full = Path(root) / dname
            reason = _unsendable(base, src, full)
            if reason is None and _islink(full):
                reason = _dir_link(full, ancestry, follow_symlinks)
            if reason is not None:
                skipped.append(Skipped(full, reason))
                dirs.remove(dname)  # not walked: each file under it would be refused alike
        # per directory, not per file: the path arithmetic was most of a 100,000-file scan
        here = Path(root)
        rel = here.relative_to(src)
        prefix = (Path(base) / rel).as_posix()
        sent_here = False
        for fname in sorted(files):
            full = here / fname
            name = f"{prefix}/{fname}"
            st, reason = _regular(full)
            if st is not None and reason is None and fname in links:
                reason = _outside(full, inside, follow_symlinks, st)
            reason = reason or _unsendable_name(name, src)
            if reason is not None:
                skipped.append(Skipped(full, reason))
                continue
            assert st is not None
            _add(found, name, full, st)
            sent_here = True
        if sent_here:
            sent_under.update(rel.parents)
            sent_under.add(rel)
    for d in walked:
        name = os.path.normpath((Path(base) / d.relative_to(src)).as_posix())
        if d.relative_to(src) not in sent_under:
            # no file under it: sent as a directory entry (manifest version 2), like rsync -a
            validate_name(name)
            empty_dirs.append(name)
        with contextlib.suppress(OSError):  # gone since it was listed: it keeps the time it gets
            st = _at(os.stat, d)
            dir_meta[0][name] = st.st_mtime_ns
            dir_meta[1][name] = stat.S_IMODE(st.st_mode)


def _tree(
    top: Path,
) -> Iterator[tuple[str, list[str], list[str], set[str], frozenset[tuple[int, int]]]]:
    """os.walk's top-down (root, dirs, files), plus the names in `files` that are symlinks and the
    (device, inode) of root and of each directory above it in this walk (a followed directory
    link must not lead back into one of them), except that a directory that cannot be listed ends
    the scan (os.walk drops it without a word, and its files with it: a checkpoint sent without
    them and called verified); and without recursion (Python 3.11's os.walk recurses: a tree ~1000
    levels deep raised RecursionError). The caller prunes `dirs`, as with os.walk; what is left in
    it is walked, symlinks to directories included."""
    stack: list[tuple[str, frozenset[tuple[int, int]]]] = [(os.fspath(top), frozenset())]
    while stack:
        root, above = stack.pop()
        dirs: list[str] = []
        files: list[str] = []
        links: set[str] = set()
        try:
            st = _at(os.stat, root)
            for name, is_dir, is_link in _listing(root):
                (dirs if is_dir else files).append(name)
                if is_link and not is_dir:
                    links.add(name)
        except OSError as exc:
            raise SourceUnreadableError(
                f"cannot list {short_path(root)}: {exc.strerror or exc}; nothing was sent",
                denied=isinstance(exc, PermissionError),
            ) from None
        ancestry = above | {(st.st_dev, st.st_ino)}
        yield root, dirs, files, links, ancestry
        stack.extend((os.path.join(root, d), ancestry) for d in reversed(dirs))


def _dir_link(link: Path, ancestry: frozenset[tuple[int, int]], follow: bool) -> str | None:
    """Why symlink-to-directory `link` is not walked; None when it is (--follow-symlinks, as
    `cp -rL` and `rsync -L` do: its tree is sent under the link's name). Without the flag it is
    skipped, as `cp -r` would copy the link and not the tree: following every link to a directory
    can pull in a home directory, or `/`, through one stray link."""
    if not follow:
        return "symlink to a directory (--follow-symlinks sends its tree)"
    try:
        st = os.stat(link)
    except OSError as exc:
        return f"symlink to a directory that cannot be read ({exc.strerror or exc})"
    if (st.st_dev, st.st_ino) in ancestry:
        return "symlink to a directory that contains it (a loop): not followed"
    return None


def _listing(root: str) -> list[tuple[str, bool, bool]]:
    """(name, is a directory (symlinks followed), is a symlink) of each entry of `root`, however
    long its path."""
    try:
        it = os.scandir(root)
    except OSError as exc:
        if exc.errno != errno.ENAMETOOLONG:
            raise
        fd = _open_dir(root)
        try:
            it = os.scandir(fd)  # works on a duplicate of fd
        finally:
            os.close(fd)
    out: list[tuple[str, bool, bool]] = []
    with it as entries:
        for entry in entries:
            try:
                is_dir = entry.is_dir()
            except OSError:
                is_dir = False
            try:
                is_link = entry.is_symlink()
            except OSError:
                is_link = True  # unknown: checked as a link (_outside), never followed unchecked
            out.append((entry.name, is_dir, is_link))
    return out


def _real_dir(src: Path) -> str:
    """Directory SOURCE `src` with every symlink resolved, ending in '/' (_outside's prefix)."""
    return os.path.join(os.path.realpath(src), "")


def _outside(link: Path, inside: str, follow_all: bool, scanned: os.stat_result) -> str | None:
    """Why symlink `link` under a directory SOURCE is not sent; None when its target's contents
    are sent under the link's name: a link to a file inside SOURCE (`inside`, _real_dir), and one
    out of SOURCE when every link met on the way is yours or root's (a Hugging Face snapshot's
    files are links to ../../blobs/…), or `follow_all` (--follow-symlinks). `scanned`: the stat
    the entry was scanned with; the file the resolution ends at must be that one.

    A link someone else made is not followed out of SOURCE, the rule of the kernel's
    fs.protected_symlinks: a link to ~/.ssh/id_ed25519 planted by a co-tenant in a shared
    checkpoint directory sent that key with the checkpoint. Skipping every link out of SOURCE
    (the first fix) sent a Hugging Face snapshot as nothing, verified, exit 0. rsync -a sends
    links as links; rq's manifest carries no links, and a receiver never creates one.

    The link can be re-pointed between the scan's stat and these checks (a co-tenant flipping it
    between the key and a file inside SOURCE got the key sent, 18% of scans): the checks' own
    resolution must end at the scanned file, and the Reader opens only that file."""
    target = os.path.realpath(link)
    if _islink(target):  # realpath gave up (a loop, a path over PATH_MAX)
        return "symlink that cannot be resolved here (its target is not sent)"
    if target.startswith(inside) or follow_all:
        return None if _same_file(target, scanned) else _REPOINTED
    foreign, final = _foreign_link(link)
    if foreign is None:
        return None if final is not None and _same_file(final, scanned) else _REPOINTED
    path, uid = foreign
    shown = short_path(target, 80)
    if uid < 0:
        return (
            f"symlink to {shown}, outside SOURCE, whose links cannot be checked (--follow-symlinks sends it)"
        )
    via = (
        ""
        if path == os.path.join(os.path.realpath(link.parent), link.name)
        else f" through {short_path(path, 60)},"
    )
    return (
        f"symlink to {shown}, outside SOURCE,{via} made by {_user(uid)}, not you: "
        "not followed (--follow-symlinks sends it)"
    )


_REPOINTED = "symlink re-pointed while it was being scanned (its target is not sent)"


def _same_file(path: str, scanned: os.stat_result) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (scanned.st_dev, scanned.st_ino)


# the kernel's MAXSYMLINKS: past this many links on one path, open() fails with ELOOP too
_MAX_HOPS = 40


def _trusted_uids() -> set[int]:
    """Whose links are followed out of SOURCE: yours, and root's (nobody else can make them)."""
    return {os.geteuid(), 0}


def _foreign_link(link: Path) -> tuple[tuple[str, int] | None, str | None]:
    """Resolves `link` component by component: the first symlink met (itself included, then every
    link in its target's path) owned by someone not in _trusted_uids, with its owner ((path, -1)
    when one cannot be checked), or None and the path the resolution ends at. SOURCE's own path
    is not checked: the user named it."""
    trusted = _trusted_uids()
    resolved = os.path.realpath(link.parent)
    todo = [link.name]
    hops = 0
    while todo:
        part = todo.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            resolved = os.path.dirname(resolved)
            continue
        path = os.path.join(resolved, part)
        try:
            st = os.lstat(path)
        except OSError:
            return (path, -1), None
        if not stat.S_ISLNK(st.st_mode):
            resolved = path
            continue
        if st.st_uid not in trusted:
            return (path, st.st_uid), None
        hops += 1
        try:
            target = os.readlink(path)
        except OSError:
            return (path, -1), None
        if hops > _MAX_HOPS:
            return (path, -1), None
        if target.startswith("/"):
            resolved = "/"
        todo[:0] = target.split("/")
    return None, resolved


def _user(uid: int) -> str:
    with contextlib.suppress(KeyError):
        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    return f"uid {uid}"


def _unsendable(base: str, src: Path, path: Path) -> str | None:
    """Why the protocol cannot carry `path`'s name (a backslash, a control character, bytes that
    are not UTF-8: names are data on the receiver, never paths); None when it can. Such an entry
    is skipped with a warning like a FIFO, instead of refusing the whole tree for one name."""
    return _unsendable_name((Path(base) / path.relative_to(src)).as_posix(), src)


def _unsendable_name(name: str, src: Path) -> str | None:
    """_unsendable of the entry sent as `name` from directory SOURCE `src`."""
    try:
        validate_name(name)
    except NameTooLongError:
        # skipped, the tree would arrive incomplete with exit 0: refused before anything is sent
        raise NameTooLongError(
            f"cannot send {display_name(str(src))}: the name {_shortened(name)} in it is "
            f"{len(os.fsencode(name))} bytes, over the {MAX_NAME_BYTES} the protocol carries; "
            "nothing was sent"
        ) from None
    except UnsafeNameError as exc:
        return f"name cannot be sent ({exc})"
    return None


def _shortened(text: str, keep: int = 40) -> str:
    text = display_name(text)
    return text if len(text) <= 2 * keep + 1 else f"{text[:keep]}…{text[-keep:]}"


def _not_regular(path: Path) -> str | None:
    """Why `path` (a name os.walk listed as a non-directory) is not sent; None for a regular file."""
    return _regular(path)[1]


def _regular(path: Path) -> tuple[os.stat_result | None, str | None]:
    """`path`'s stat for a regular file (one stat serves the check and the entry), else why not."""
    try:
        st = _at(os.stat, path)
    except FileNotFoundError:
        try:
            link = stat.S_ISLNK(_at(os.lstat, path).st_mode)
        except OSError:
            link = False
        return None, "broken symlink" if link else "disappeared while scanning"
    except OSError as exc:
        return None, f"cannot stat: {exc.strerror or exc}"
    mode = st.st_mode
    if stat.S_ISREG(mode):
        return st, None
    kind = "FIFO" if stat.S_ISFIFO(mode) else "socket" if stat.S_ISSOCK(mode) else "device or special file"
    return None, f"not a regular file ({kind})"


def _add(
    found: dict[str, tuple[SourceFile, int]], name: str, path: Path, st: os.stat_result | None = None
) -> None:
    name = os.path.normpath(name).replace(os.sep, "/")
    validate_name(name)  # we would refuse our own manifest otherwise; say so here
    if name in found:
        raise TransferError(f"two sources would both be sent as {name!r}")
    st = st or _at(os.stat, path)
    found[name] = (_identity(path, st), stat.S_IMODE(st.st_mode))


def source_error(path: Path, exc: OSError) -> TransferError:
    """A local OSError on a source file being sent, as the error that ends the send at once."""
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        # the process's (or the system's) open-files limit, not the file: it was exit 5, "cannot
        # be read any more", which sent people looking for what changed the file
        return ResourceLimitError(f"cannot open {short_path(path)}: {exc.strerror or exc}")
    if isinstance(exc, FileNotFoundError):
        return SourceChangedError(f"{short_path(path)} disappeared while it was being sent")
    if isinstance(exc, PermissionError):  # never readable: a re-run cannot help until it is
        return SourceUnreadableError(f"cannot read {short_path(path)}: {exc.strerror or exc}", denied=True)
    return SourceChangedError(f"{short_path(path)} cannot be read any more: {exc.strerror or exc}")


def check_unchanged(files: list[SourceFile]) -> None:
    """Raises SourceChangedError if a file changed since it was scanned (after its last chunk was read)."""
    for sf in files:
        try:
            now = _identity(sf.path)
        except OSError as exc:
            raise source_error(sf.path, exc) from None
        if now.stamp() != sf.stamp():
            raise SourceChangedError(
                f"{short_path(sf.path)} changed while it was being sent; re-run to send the new version"
            )


MAX_OPEN = 8  # source descriptors one Reader keeps open
# Chunks at least this long, of a file holding a read lease, are sent from a mapping of the file
# instead of a copy (Reader below). Smaller ones gain nothing worth a mapping each.
MAP_MIN = 1 << 20
# A lease break leaves the breaker waiting this long at most (/proc/sys/fs/lease-break-time, 45 s by
# default) before the kernel takes the lease away; below this rq does not map source files at all.
MIN_LEASE_BREAK_S = 10
# The signal the kernel sends the lease holder when a lease is broken. Its default action is to
# ignore it (SIGIO, the default, would kill rq): rq asks fcntl(F_GETLEASE) instead of catching it.
LEASE_SIGNAL = signal.SIGURG
_leases: bool | None = None


def leases_usable() -> bool:
    """Whether this process may send from mappings under read leases (asked once): Linux, a
    lease-break time long enough, and nobody in this process handling LEASE_SIGNAL."""
    global _leases
    if _leases is None:
        try:
            with open("/proc/sys/fs/lease-break-time") as fh:
                wait_s = int(fh.read().strip())
            _leases = (
                hasattr(fcntl, "F_SETLEASE")
                and wait_s >= MIN_LEASE_BREAK_S
                and signal.getsignal(LEASE_SIGNAL) in (signal.SIG_DFL, signal.SIG_IGN)
            )
        except (OSError, ValueError):
            _leases = False
    return _leases


# statfs f_type of the file systems whose data lives here and whose every writer goes through this
# kernel's VFS, so a read lease holds off each open for writing and each truncate: ext4 (and
# ext2/3), XFS, Btrfs, tmpfs, F2FS. Not overlayfs, NFS, FUSE, CIFS: the file is read with pread there.
LEASE_FILE_SYSTEMS = frozenset({0xEF53, 0x58465342, 0x9123683E, 0x01021994, 0xF2F52010})


class Reader:
    """Reads chunks into a page-aligned buffer it reuses (fresh memory is slow to touch here).

    A chunk the page cache holds (a checkpoint just written) is copied from there; one it does not
    is read with O_DIRECT instead, at the disk's speed: reading an uncached 4 GiB file through the
    page cache took 5.1 s here, 4.1 s of it system time, against 2.3 s around it (docs/transfer.md).
    cachestat(2) tells the two apart (RWF_NOWAIT cannot: it starts readahead into the very pages we
    mean to avoid); where the kernel lacks it (before 6.5), everything goes through the page cache.

    With `mapped` (the channel's send reads the payload only in the kernel: TcpChannel.map_safe), a
    cached chunk of a file this reader holds a read lease on is not copied at all: read() returns a
    view of the file mapped, which the caller hashes and sends (~0.35 CPU-s less per 4 GiB sent).
    A mapped page that a truncation took away would kill rq with SIGBUS when touched, so a file is
    mapped only under a read lease (fcntl F_SETLEASE F_RDLCK): the kernel refuses one while anybody
    has the file open for writing (then it is read as before), and while it is held, an open for
    writing or a truncate by anybody else waits until rq gives it back (at most lease-break-time).
    rq looks at the lease (F_GETLEASE) before it maps a chunk and before each piece it sends
    (steady()); once a break is pending it copies the chunk with pread, gives the lease back and
    reads that file with pread from then on, so the source's "changed" checks are the same as without
    leases. The map is touched in user space only while hashing, right after the lease was seen
    whole; the one way left to SIGBUS is rq stopped (SIGSTOP, a cgroup freezer) longer than
    lease-break-time in that fraction of a millisecond while the file is truncated (docs/transfer.md)."""

    def __init__(self, files: list[SourceFile], chunk_size: int, mapped: bool = False):
        self._files = files
        self._chunk = chunk_size
        self._fds: dict[int, tuple[int, int]] = {}  # file index → (buffered fd, O_DIRECT fd or -1)
        self._buf = aligned.buffer(chunk_size)
        self._direct = chunk_size % aligned.ALIGN == 0 and cachestat.available()
        self._map_ok = mapped and chunk_size % mmap.ALLOCATIONGRANULARITY == 0 and leases_usable()
        self.leased: set[int] = set()  # files whose buffered fd holds a read lease
        self._map: tuple[mmap.mmap, int, int, int, int] | None = (
            None  # the current chunk: map, f, fd, off, len
        )
        self.mapped = False  # the last read() returned a view of a mapping

    def _open(self, f: int) -> tuple[int, int]:
        fds = self._fds.pop(f, None)
        if fds is None:
            if len(self._fds) >= MAX_OPEN:  # hundreds of shards must not mean hundreds of descriptors
                old = next(iter(self._fds))
                self.leased.discard(old)  # closing its descriptor gives its lease back
                _close(self._fds.pop(old))
            path = self._files[f].path
            fd = _at(os.open, path, os.O_RDONLY | os.O_CLOEXEC)
            st = os.fstat(fd)
            if (st.st_ino, st.st_dev) != (self._files[f].inode, self._files[f].dev):
                # another file by now (a symlink re-pointed since the scan, perhaps outside
                # SOURCE): never read from it
                os.close(fd)
                raise SourceChangedError(
                    f"{short_path(path)} changed while it was being sent; re-run to send the new version"
                )
            dfd = -1
            if self._direct:
                try:
                    dfd = _at(os.open, path, os.O_RDONLY | os.O_CLOEXEC | aligned.O_DIRECT)
                except OSError:
                    dfd = -1  # a file system without O_DIRECT: the page cache it is
            fds = (fd, dfd)
            if self._map_ok and self._files[f].size >= MAP_MIN:
                self._lease(f, fd)
        self._fds[f] = fds  # most recently used last
        return fds

    def _lease(self, f: int, fd: int) -> None:
        """Takes a read lease on `fd` if the kernel grants one and the file is still the version
        scanned (its size then bounds every chunk mapped); otherwise the file is read as before.
        Only on local file systems whose leases see every change: on overlayfs a truncate of the
        layer below breaks no lease (a review saw SIGBUS, 4 runs in 12), and NFS or FUSE files
        change on other machines and in other processes that no local lease holds off."""
        from transfer.reserve import fs_magic

        if fs_magic(fd) not in LEASE_FILE_SYSTEMS:
            return
        try:
            fcntl.fcntl(fd, fcntl.F_SETSIG, LEASE_SIGNAL)
            fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
        except OSError:
            return  # open for writing somewhere (EAGAIN), not ours (EACCES), no leases here (EINVAL)
        try:
            st = os.fstat(fd)
        except OSError:
            st = None
        sf = self._files[f]
        if st is None or (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns, st.st_dev) != sf.stamp():
            self._unlease(f, fd)  # changed since the scan: pread, and the usual checks say so
            return
        self.leased.add(f)

    def _unlease(self, f: int, fd: int) -> None:
        self.leased.discard(f)
        with contextlib.suppress(OSError):  # already taken away by the kernel: nothing to give back
            fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)

    def _lease_whole(self, f: int, fd: int) -> bool:
        """True while this reader holds the lease on `f` and no break is pending (nobody waits to
        open it for writing or to truncate it)."""
        if f not in self.leased:
            return False
        try:
            return bool(fcntl.fcntl(fd, fcntl.F_GETLEASE) == fcntl.F_RDLCK)
        except OSError:
            return False

    def read(self, f: int, k: int, length: int) -> memoryview:
        """Chunk `k` of file `f`, valid until the next read() or close(). A local failure (the file
        gone, unreadable, an I/O error) raises SourceChangedError: it is this side's source, which no
        reconnect will bring back, so it must never look like the OSError of a lost connection that
        the sender retries."""
        self._unmap()
        try:
            return self._read(f, k, length)
        except OSError as exc:
            raise source_error(self._files[f].path, exc) from None

    def _read(self, f: int, k: int, length: int) -> memoryview:
        for other in [g for g in self.leased if g != f]:
            self.finished(other)  # moved on: a writer of a file already sent must not wait for us
        fd, dfd = self._open(f)
        view = self._buf[:length]
        off = k * self._chunk
        if f in self.leased and not self._lease_whole(f, fd):
            self._unlease(f, fd)  # somebody waits to write it: let them; pread from now on
        cached = not (dfd >= 0 and self._direct) or cachestat.all_cached(fd, off, length)
        if length >= MAP_MIN and cached and f in self.leased:
            m = mmap.mmap(fd, length, mmap.MAP_SHARED | mmap.MAP_POPULATE, mmap.PROT_READ, offset=off)
            self._map = (m, f, fd, off, length)
            self.mapped = True
            return memoryview(m)
        got = 0
        if not cached:
            got = self._read_direct(dfd, view, off)
        return self._pread(f, fd, view, off, got)

    def _pread(self, f: int, fd: int, view: memoryview, off: int, got: int) -> memoryview:
        while got < len(view):
            n = os.preadv(fd, [view[got:]], off + got)
            if n == 0:
                raise SourceChangedError(f"{short_path(self._files[f].path)} shrank while it was being sent")
            got += n
        return view

    def steady(self, part: memoryview) -> memoryview:
        """What to go on sending the chunk the last read() mapped from (`part`, or a view of the same
        bytes): the mapping while the lease holds; once a break is pending, the chunk read again with
        pread into the reader's own buffer while the writer still waits (the kernel copies it: even
        after the kernel took the lease away, a page gone is a short read, never SIGBUS), and then
        the lease is given back so the writer goes on."""
        if self._map is None:
            return part
        _, f, fd, off, length = self._map
        if self._lease_whole(f, fd):
            return part
        self._unmap()
        try:
            return self._pread(f, fd, self._buf[:length], off, 0)
        except OSError as exc:
            raise source_error(self._files[f].path, exc) from None
        finally:
            self._unlease(f, fd)

    def finished(self, f: int) -> None:
        """Gives back the lease on file `f` (its last chunk went out, or the reader moved on to
        another file): a writer of a file rq has sent waited until the whole send ended, for as
        long as the receiver took to acknowledge, up to lease-break-time. Later chunks of `f` (a
        resend) are read with pread."""
        if f not in self.leased:
            return
        if self._map is not None and self._map[1] == f:
            self._unmap()
        fds = self._fds.get(f)
        if fds is not None:
            self._unlease(f, fds[0])
        else:
            self.leased.discard(f)

    def _unmap(self) -> None:
        self.mapped = False
        if self._map is not None:
            m = self._map[0]
            self._map = None
            # a view still held elsewhere (a traceback's frame) keeps the mapping until it goes;
            # nothing reads it any more
            with contextlib.suppress(BufferError):
                m.close()

    def _read_direct(self, dfd: int, view: memoryview, off: int) -> int:
        """Reads whole blocks with O_DIRECT; returns where the buffered read goes on (the unaligned
        tail of a file, or all of it where O_DIRECT refuses)."""
        got = 0
        whole = len(view) // aligned.ALIGN * aligned.ALIGN
        while got < whole:
            try:
                n = os.preadv(dfd, [view[got:whole]], off + got)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                self._direct = False  # a stricter alignment than ours: buffered from now on
                break
            if n == 0:
                break  # end of file (it shrank): the buffered read says so
            got += n
            if n % aligned.ALIGN:
                break
        return got

    def close(self) -> None:
        self._unmap()
        self.leased.clear()  # closing the descriptors gives the leases back
        for fds in self._fds.values():
            _close(fds)
        self._fds.clear()


def _close(fds: tuple[int, int]) -> None:
    for fd in fds:
        if fd >= 0:
            os.close(fd)
