"""RAM tiers left in /dev/shm by caches whose directory was deleted.

A cache's default RAM root is /dev/shm/rq-cache-<hash of the cache dir's path>. `rm -rf` of the
cache directory leaves that root behind, and what it holds stays in RAM, outside every cap, until
someone removes it. (A cache made again at the same path finds and sweeps it: cache.api.) So:

- each root records its cache directory in `owner`, rewritten whenever a cache opens it (a cache
  moved with `mv` claims it again on its next open), and a new cache never adopts a root whose
  `owner` names another cache that exists;
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
import fcntl
import os
import re
import secrets
import shutil
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from cache.errors import CacheError
from cache.layout import INDEX_NAME

SHM = Path("/dev/shm")
OWNER_NAME = "owner"
MIN_AGE = 60.0  # seconds a root must have been left alone before it may be called an orphan
HOLD_PATIENCE = 30.0  # seconds a cache waits for a remover to let go of its root
_NAME = re.compile(r"rq-cache-[0-9a-f]{12}")
_TRASH = re.compile(r"\.rq-cache-[0-9a-f]{12}\.removing\.[0-9a-f]{16}")
_OWNER_MAX = 8192


@dataclass(frozen=True)
class RamRoot:
    """One /dev/shm/rq-cache-* directory of ours, as `find` saw it."""

    path: Path
    owner: Path | None  # the cache directory it names; None: made by an rq without `owner`
    size: int  # bytes in its files
    # "orphan" and "empty" (no files, no owner) are removable; "removing": a removal was cut short
    # (removable); "unclaimed": made by an rq without `owner` (or writable by others), never removed
    state: str


def mark_owner(ram_root: Path, cache_dir: Path) -> None:
    """Records (atomically) the cache directory `ram_root` belongs to, if it does not say so yet."""
    if read_owner(ram_root) == cache_dir:
        return
    tmp = ram_root / f".{OWNER_NAME}.{secrets.token_hex(8)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, os.fsencode(cache_dir) + b"\n")
    finally:
        os.close(fd)
    os.replace(tmp, ram_root / OWNER_NAME)


def read_owner(ram_root: Path) -> Path | None:
    """The cache directory `owner` names, or None where it is missing or not one of ours."""
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
    if not data.endswith(b"\n"):
        return None
    path = data[:-1]  # exactly one newline: a directory name may itself end in spaces or newlines
    if not path.startswith(b"/") or b"\0" in path:
        return None
    return Path(os.fsdecode(path))


def claimed_by_another(ram_root: Path, cache_dir: Path) -> bool:
    """Whether `ram_root` serves a cache other than `cache_dir` (one moved here from this path
    keeps the root named after its old path): a new cache must then make a root of its own."""
    owner = read_owner(ram_root)
    return owner is not None and owner != cache_dir and _claimed(owner)


def _claimed(owner: Path) -> bool:
    """Whether `owner` holds a cache index; a path we cannot look at counts as claimed."""
    try:
        os.stat(owner / INDEX_NAME)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError:
        return True
    return True


def hold(ram_root: Path, patience: float = HOLD_PATIENCE) -> int | None:
    """A descriptor holding a shared lock on `ram_root` (keep it open while the cache is used);
    None when the root was renamed away or replaced while we waited for the lock (make it again
    and retry); -1 where there is no lock to be had (no flock on this file system)."""
    try:
        fd = _open_dir(ram_root)
    except FileNotFoundError:
        return None
    deadline = time.monotonic() + patience
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            # a remover holds it for a few milliseconds; one stopped mid-way must not hang us
            if time.monotonic() > deadline:
                os.close(fd)
                raise CacheError(
                    f"RAM tier directory {ram_root} stays locked by a process removing it "
                    "(`rq cache orphans --remove`); let it finish, or stop it"
                ) from None
            time.sleep(0.01)
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
    """Our RAM roots in `shm` that no cache claims: orphans, empty ones, unclaimed ones (which an
    older rq made without `owner`: listed, never removed), and what a removal that was
    interrupted left half-deleted. Roots in use are left out."""
    found = []
    try:
        names = sorted(os.listdir(shm))
    except OSError:
        return []
    for name in names:
        if _NAME.fullmatch(name):
            root = _inspect(shm / name, min_age)
        elif _TRASH.fullmatch(name):
            root = _inspect_trash(shm / name)
        else:
            continue
        if root is not None:
            found.append(root)
    return found


def _inspect_trash(path: Path) -> RamRoot | None:
    """A root `remove` renamed away and did not finish deleting: nobody can use it any more."""
    if _our_dir(path) is None:
        return None
    size, _files, _newest = _survey(path)
    return RamRoot(path, read_owner(path), size, "removing")


def _inspect(path: Path, min_age: float, fd: int = -1) -> RamRoot | None:
    """What `path` is, or None when it is not ours to judge (someone else's, in use, young, or
    claimed by a cache). With `fd` the caller already holds the exclusive lock."""
    st = _our_dir(path)
    if st is None:
        return None
    # others could have written the `owner` of a root they can write (an older rq made some so)
    owner = None if st.st_mode & 0o022 else read_owner(path)
    if owner is not None and _claimed(owner):
        return None  # claimed (a moved or re-made cache at that path included)
    size, files, newest = _survey(path)
    if time.time() - newest < min_age:
        return None
    if fd < 0 and _in_use(path):
        return None
    if owner is not None:
        return RamRoot(path, owner, size, "orphan")
    return RamRoot(path, None, size, "unclaimed" if files or st.st_mode & 0o022 else "empty")


def _our_dir(path: Path) -> os.stat_result | None:
    """Its lstat when `path` is a real directory (not a symlink) owned by us, else None."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() else None


def _open_dir(path: Path) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


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
        fd = _open_dir(path)
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
    """Removes an orphan, empty or half-removed root found by `find`, if it still is one; False
    if it is not (any more), if another process got there first, or for an unclaimed one, which
    only its owner can know to remove."""
    if root.state == "unclaimed":
        return False
    if root.state == "removing":
        shutil.rmtree(root.path, ignore_errors=True)
        return not os.path.lexists(root.path)
    try:
        fd = _open_dir(root.path)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        now = _inspect(root.path, min_age, fd)
        try:
            same = _same_file(os.fstat(fd), os.lstat(root.path))
        except OSError:
            return False
        if now is None or now.state == "unclaimed" or not same:
            return False
        # an unpredictable name: nobody can plant something there to make the rename fail
        trash = root.path.with_name(f".{root.path.name}.removing.{secrets.token_hex(8)}")
        try:
            os.rename(root.path, trash)
        except OSError:
            return False
    finally:
        os.close(fd)  # a cache waiting to open the path goes on now and makes a fresh root
    # the root is gone for every cache; a kill during the deletion leaves the trash, which `find`
    # reports (state "removing") and `remove` finishes
    shutil.rmtree(trash, ignore_errors=True)
    return not os.path.lexists(trash)


# One lock descriptor per process and root, however many Cache objects use it (each used to hold
# its own, and a program keeping hundreds of them ran out of descriptors): (pid, root) -> [fd, users]
_holds: dict[tuple[int, Path], list[int]] = {}
# re-entrant: a Cache collected by the GC inside a registry call releases from its __del__
_holds_lock = threading.RLock()


def _after_fork_in_child() -> None:
    global _holds_lock
    _holds_lock = threading.RLock()  # a fork while another thread held it must not hang the child


os.register_at_fork(after_in_child=_after_fork_in_child)


def acquire(ram_root: Path) -> bool:
    """Counts one more user of `ram_root` in this process, taking its lock for the first; False
    when the root was renamed away or replaced meanwhile (make it again and retry)."""
    key = (os.getpid(), ram_root)
    with _holds_lock:
        held = _holds.get(key)
        if held is not None:
            held[1] += 1  # already locked by this process: nobody can remove it under us
            return True
    fd = hold(ram_root)  # may wait for a remover: not under the registry's lock
    if fd is None:
        return False
    with _holds_lock:
        held = _holds.get(key)
        if held is None:
            _holds[key] = [fd, 1]
            return True
        held[1] += 1
    if fd >= 0:
        os.close(fd)  # another thread of ours took it meanwhile
    return True


def renew(ram_root: Path) -> bool:
    """After `ram_root` was removed and made again under this process: the lock it holds is on the
    deleted directory, so `rq cache orphans` would see the new one as unused. Takes the new one's
    lock in its place, the count of users unchanged; False as acquire()."""
    key = (os.getpid(), ram_root)
    fd = hold(ram_root)
    if fd is None:
        return False
    with _holds_lock:
        held = _holds.get(key)
        if held is None:
            _holds[key] = [fd, 1]
            return True
        old, held[0] = held[0], fd
    if old >= 0:
        with contextlib.suppress(OSError):
            os.close(old)
    return True


def release(ram_root: Path) -> None:
    """One user fewer; the last one lets the lock go."""
    key = (os.getpid(), ram_root)
    with _holds_lock:
        held = _holds.get(key)
        if held is None:
            return
        held[1] -= 1
        if held[1] > 0:
            return
        del _holds[key]
    if held[0] >= 0:
        with contextlib.suppress(OSError):
            os.close(held[0])
