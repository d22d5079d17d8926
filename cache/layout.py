"""Where things live on disk. Names come from hashes, never from keys, so no key can reach outside.

<cache_dir>/
  index.sqlite3            the index (SQLite, WAL): entries, holds, settings
  objects/ab/<32 hex>-<tail>   disk-tier blobs; <tail> is a sanitised copy of the key's last part
  tmp/                     disk-tier downloads in progress (<blob>.part, <blob>.journal)
  ram -> /dev/shm/rq-…     symlink to the RAM tier root (objects/ and tmp/ inside, same shape)
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

import xxhash

from cache.errors import BadSourceError, CacheError, FileSystemFullError, UnsafeDirError
from cache.sizes import no_space_under

TIERS = ("ram", "disk")
INDEX_NAME = "index.sqlite3"
_TAIL_OK = re.compile(r"[^A-Za-z0-9._-]+")
# what blob_name makes (and a retired one's `.retired-<hex>` after it): one level under objects/
_BLOB = re.compile(r"[0-9a-f]{2}/[0-9a-f]{32}-[A-Za-z0-9._-]+")
_HEX32 = re.compile(r"[0-9a-f]{32}")


def blob_name(url: str, version: str) -> str:
    """`ab/<hex>-<tail>`: the hash names the (url, version) pair, the tail only helps a person reading `ls`."""
    digest = xxhash.xxh3_128(f"{url}\0{version}".encode("utf-8", "surrogatepass")).hexdigest()
    last = url.rstrip("/").rsplit("/", 1)[-1]
    tail = _TAIL_OK.sub("_", last).lstrip(".")[:40] or "obj"
    return f"{digest[:2]}/{digest}-{tail}"


def blob_hash(blob: str) -> str:
    """The 32 hex characters naming a blob (and its tmp files). A name from a damaged index that
    has none (`ab/../../x`) gets a hash of its own: never a path to put under tmp/."""
    head = blob.split("/", 1)[-1][:32]
    if _HEX32.fullmatch(head) is None:
        return xxhash.xxh3_128(blob.encode("utf-8", "surrogatepass")).hexdigest()
    return head


def default_ram_root(cache_dir: Path, n: int = 0) -> Path:
    """One RAM root per cache dir, so two caches on a node never share RAM-tier files by accident;
    `n` > 0: the next names to try when another cache still uses the first (cache.api)."""
    name = str(cache_dir.resolve()) + (f"\0{n}" if n else "")
    tag = xxhash.xxh3_64(name.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return Path("/dev/shm") / f"rq-cache-{tag}"


@dataclass(frozen=True)
class Layout:
    root: Path
    ram_root: Path

    @property
    def index_path(self) -> Path:
        return self.root / INDEX_NAME

    def tier_root(self, tier: str) -> Path:
        return self.ram_root if tier == "ram" else self.root

    def blob_path(self, tier: str, blob: str) -> Path:
        """objects/<blob>. A blob name from a damaged or edited index that is not `ab/<hash>-<tail>`
        (`ab/../../x`, an absolute path) maps to a name under objects/.invalid/ that nothing else
        uses: such an entry reads as missing and is fetched again, and no remover ever unlinks a
        file outside the tier (`rq cache cat` deleted the file such a row named, anywhere)."""
        if _BLOB.fullmatch(blob) is None:
            tag = xxhash.xxh3_128(blob.encode("utf-8", "surrogatepass")).hexdigest()
            return self.tier_root(tier) / "objects" / ".invalid" / tag
        return self.tier_root(tier) / "objects" / blob

    def tmp_path(self, tier: str, blob: str, suffix: str) -> Path:
        """`tmp/<32 hex><suffix>`: flat, named by the blob's hash (recovery matches on those 32 chars),
        in the same file system as objects/ so the final rename is atomic."""
        return self.tier_root(tier) / "tmp" / (blob_hash(blob) + suffix)

    def create(self, tighten: bool = False, ram: bool = True) -> None:
        """Makes the tiers' directories: the disk tier's first, so a RAM root that cannot be made
        (raising OSError) leaves a usable disk tier; `ram` False: the disk tier only."""
        for sub in ("objects", "tmp"):
            make_private(self.root / sub)
        if not ram:
            return
        check_private_dir(self.ram_root, tighten)
        for sub in ("objects", "tmp"):
            make_private(self.ram_root / sub)
        link = self.root / "ram"
        try:
            if not link.is_symlink() and not link.exists():
                os.symlink(self.ram_root, link)
            elif link.is_symlink() and os.readlink(link) != str(self.ram_root):
                # the cache moved to another root (its old name was taken): point there instead
                new = self.root / f".ram.{os.getpid()}"
                with contextlib.suppress(FileNotFoundError):
                    new.unlink()
                os.symlink(self.ram_root, new)
                os.replace(new, link)
        except OSError:
            pass  # informational only; a read-only or odd file system is fine without it


# Errors of a RAM root that cannot be made at all (a read-only or missing /dev/shm, one we may
# not write in): the machine has no usable RAM tier; the disk tier works without it.
NO_RAM_ERRNOS = frozenset({errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT, errno.ENOTDIR})


def check_cache_dir(root: Path, what: str = "") -> None:
    """Refuses to adopt a directory that holds someone's files: rq sweeps a cache's tmp/ and
    objects/ of whatever it does not know, so pointing --cache-dir at a project directory by
    mistake must fail, not delete. A cache is a directory with our index, or an empty one; a RAM
    directory given to a new cache (`what`) must be empty."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return
    except NotADirectoryError:
        raise UnsafeDirError(f"{root} is not a directory") from None
    except OSError as exc:
        raise dir_error(root, "cache directory", exc) from None
    if what and names:
        raise UnsafeDirError(f"{what} {root} is not empty; give the cache a new or empty one")
    if names and INDEX_NAME not in names:
        raise UnsafeDirError(
            f"{root} is not an rq cache (no {INDEX_NAME}) and is not empty; choose a new or empty "
            "directory for the cache (an rq cache whose index was lost can be removed)"
        )


def check_private_dir(path: Path, tighten: bool = False) -> None:
    """The RAM root sits in /dev/shm under a name anyone can predict: another user could plant it
    (or symlinks inside it) and have our sweeps delete their choice of files. It must be a real
    directory owned by us that nobody else can write; a new one is made 0700, and with `tighten`
    (rq's own default root, which older versions made under the umask) an existing group-writable
    one of ours is made 0700 rather than refused."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(path, 0o700)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDirError(f"RAM tier directory {path} is not a directory (a symlink?); refusing to use it")
    if st.st_uid != os.geteuid():
        raise UnsafeDirError(
            f"RAM tier directory {path} belongs to uid {st.st_uid}, not to you; refusing to use it "
            "(remove it, or give the cache another ram_dir)"
        )
    if st.st_mode & stat.S_IWGRP and not st.st_mode & stat.S_IWOTH and tighten:
        os.chmod(path, 0o700)  # 0775 from an older rq under umask 002 (one's own group)
    elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeDirError(
            f"RAM tier directory {path} is writable by other users; refusing to use it (chmod go-w it)"
        )


PRIVATE = 0o700  # every directory rq makes in a cache, whatever the umask


def make_private(path: Path) -> bool:
    """Makes a directory of the cache `0700` (os.mkdir's mode is masked by the umask, which can
    only take bits away: under umask 000 a plain mkdir made it 0777, and another user could
    replace what is in it). One that is there already and that others can write (an older rq
    made it under umask 002 or 000) is made 0700 too; one that others may only read is left as
    we set it; one of another user's is refused (`tighten`). True when this call made it. Raises
    OSError as mkdir does."""
    try:
        os.mkdir(path, PRIVATE)
        return True
    except FileExistsError:
        pass
    except FileNotFoundError:
        # the directories above it that rq makes (~/.cache/rq for the default) are made 0700 too:
        # whoever can write the one holding the cache can rename the cache away and put theirs
        missing = [p for p in path.parents if not p.exists()]
        for parent in reversed(missing):
            with contextlib.suppress(FileExistsError):
                os.mkdir(parent, PRIVATE)
        try:
            os.mkdir(path, PRIVATE)
            return True
        except FileExistsError:
            pass
    tighten(path)
    return False


def tighten(path: Path) -> None:
    """An existing directory of the cache that others can write is made 0700 when it is ours.
    One of another user's is refused (UnsafeDirError), whatever its mode: its owner writes the
    index, and the index says where rq writes and what its sweeps delete (its RAM root), so
    reading it would let them aim our writes and deletes at our own files. A file system that
    cannot change modes (read-only) leaves it as it is."""
    try:
        st = os.stat(path)
    except OSError:
        return
    if not stat.S_ISDIR(st.st_mode):
        return
    if st.st_uid != os.geteuid():
        raise UnsafeDirError(
            f"cache directory {path} belongs to uid {st.st_uid}, not to you; refusing to use it "
            "(its index decides where rq writes and deletes: give the cache a directory of your own)"
        )
    if not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return
    try:
        os.chmod(path, PRIVATE)
    except OSError as exc:
        if exc.errno not in (errno.EROFS, errno.EPERM, errno.EACCES):
            raise


def dir_error(path: Path, what: str, exc: OSError) -> CacheError:
    """A directory rq cannot make or read (`/proc/x`, a read-only file system, a path through a
    file): a bad path given to it, one line, not a bare OSError. A full file system is that."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return FileSystemFullError(no_space_under(path, exc, f" to make the {what}"))
    err = BadSourceError(f"cannot use {path} as the {what}: {exc.strerror or exc}")
    if what == "cache directory":  # (a default under HOME, in a container with a read-only root: ct)
        err.hint = "give one rq can write: --cache-dir DIR or RQ_CACHE_DIR"  # type: ignore[attr-defined]
    return err
