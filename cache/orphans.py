"""RAM tiers left in /dev/shm by caches whose directory was deleted.

A cache's default RAM root is /dev/shm/rq-cache-<hash of the cache dir's path>. `rm -rf` of the
cache directory leaves that root behind, and what it holds stays in RAM, outside every cap, until
someone removes it. (A cache made again at the same path finds and sweeps it: cache.api.) So:

- each root records its cache directory in `owner`, rewritten whenever a cache opens it (a cache
  moved with `mv` claims its root again on its next open);
- every Cache holds a shared flock on its RAM root for as long as it lives, forked DataLoader
  workers included (they inherit the descriptor);
- a root is an orphan when its owner holds no index, nobody holds the lock, and nothing in it
  changed for MIN_AGE seconds. Removal takes the lock exclusively, checks again, renames the root
  away (a cache opening it meanwhile waits on the lock, then sees the path replaced and makes a
  fresh root) and only then deletes it.

The lock is not trusted alone: the owner check and the age guard must agree too.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from cache.layout import INDEX_NAME

SHM = Path("/dev/shm")
OWNER_NAME = "owner"
MIN_AGE = 60.0  # seconds a root must have been left alone before it may be called an orphan
_NAME = re.compile(r"rq-cache-[0-9a-f]{12}")
_OWNER_MAX = 8192


@dataclass(frozen=True)
class RamRoot:
    """One /dev/shm/rq-cache-* directory of ours, as `find` saw it."""

    path: Path
    owner: Path | None  # the cache directory it names; None: made by an rq without `owner`
    size: int  # bytes in its files
    state: str  # "orphan" (removable), "empty" (no files, no owner: removable), "unclaimed"


def mark_owner(ram_root: Path, cache_dir: Path) -> None:
    """Records (atomically) which cache directory `ram_root` belongs to, if it does not say so yet."""
    text = f"{cache_dir}\n"
    if read_owner(ram_root) == cache_dir:
        return
    tmp = ram_root / f".{OWNER_NAME}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, text.encode("utf-8", "surrogateescape"))
    finally:
        os.close(fd)
    os.replace(tmp, ram_root / OWNER_NAME)


def read_owner(ram_root: Path) -> Path | None:
    try:
        fd = os.open(ram_root / OWNER_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.read(fd, _OWNER_MAX)
    except OSError:
        return None
    finally:
        os.close(fd)
    text = data.decode("utf-8", "surrogateescape").strip()
    return Path(text) if text.startswith("/") and "\0" not in text else None


def hold(ram_root: Path) -> int | None:
    """A descriptor holding a shared lock on `ram_root` (keep it open while the cache is used);
    None when the root was renamed away or replaced while we waited for the lock (make it again
    and retry); -1 where the file system has no flock (the lock is then simply not there)."""
    try:
        fd = os.open(ram_root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    except OSError:
        os.close(fd)
        return -1
    try:
        same = _same_file(os.fstat(fd), os.lstat(ram_root))
    except FileNotFoundError:
        same = False
    if not same:
        os.close(fd)
        return None
    return fd


def _same_file(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def find(shm: Path = SHM, min_age: float = MIN_AGE) -> list[RamRoot]:
    """Our RAM roots in `shm` that no cache claims: orphans, empty ones, and unclaimed ones (which
    an older rq made without `owner`: listed, never removed). Roots in use are left out."""
    found = []
    try:
        names = sorted(os.listdir(shm))
    except OSError:
        return []
    for name in names:
        if not _NAME.fullmatch(name):
            continue
        root = _inspect(shm / name, min_age)
        if root is not None:
            found.append(root)
    return found


def _inspect(path: Path, min_age: float, fd: int = -1) -> RamRoot | None:
    """What `path` is, or None when it is not ours to judge (someone else's, in use, young, or
    claimed by a cache). With `fd` the caller already holds the exclusive lock."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        return None
    owner = read_owner(path)
    if owner is not None and (owner / INDEX_NAME).exists():
        return None  # claimed (a moved or re-made cache at that path included)
    size, files, newest = _survey(path)
    if time.time() - newest < min_age:
        return None
    if fd < 0 and _in_use(path):
        return None
    if owner is not None:
        return RamRoot(path, owner, size, "orphan")
    return RamRoot(path, None, size, "unclaimed" if files else "empty")


def _survey(path: Path) -> tuple[int, int, float]:
    """(bytes, files, newest mtime) of a tree, never following a symlink."""
    size = files = 0
    newest = 0.0
    for dirpath, dirnames, filenames in os.walk(path):
        with contextlib.suppress(OSError):
            newest = max(newest, os.lstat(dirpath).st_mtime)
        for name in filenames if dirpath != str(path) else ():  # the top holds only `owner`
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            newest = max(newest, st.st_mtime)
            if stat.S_ISREG(st.st_mode):
                size += st.st_size
                files += 1
        dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
    return size, files, newest


def _in_use(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True  # held by a cache (or no flock here: then never call it unused)
    finally:
        os.close(fd)
    return False


def remove(root: RamRoot, min_age: float = MIN_AGE) -> bool:
    """Removes an orphan or empty root found by `find`, if it still is one; False if it is not
    (any more), or if it is an unclaimed one, which only its owner can know to remove."""
    if root.state == "unclaimed":
        return False
    try:
        fd = os.open(root.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        now = _inspect(root.path, min_age, fd)
        if now is None or now.state == "unclaimed" or not _same_file(os.fstat(fd), os.lstat(root.path)):
            return False
        trash = root.path.with_name(f".{root.path.name}.removing.{os.getpid()}")
        try:
            os.rename(root.path, trash)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.EEXIST, errno.ENOTEMPTY):
                return False
            raise
        shutil.rmtree(trash, ignore_errors=True)
        return True
    finally:
        os.close(fd)
