"""Human sizes: `512M`, `4GiB`, `1.5T`, plain bytes; and back."""

from __future__ import annotations

import errno
import os
import re

from cache.errors import BadSourceError

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}
# The index, JSON readers (orjson, jq, Go) and the kernel all keep sizes in signed 64 bits.
MAX_SIZE = 2**63 - 1
# ASCII digits only: \d also matches other scripts' digits (`--chunk-size ٤M` was 4 MiB)
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP]?)(?:I?B)?\s*$", re.IGNORECASE | re.ASCII)


def parse_size(text: str | int | float) -> int:
    """Bytes from `text`; units are binary (K = 1024) whether written `K`, `KB` or `KiB`.
    A number without a unit is a count of bytes, so it must be whole (`0.5` is refused, not taken
    as 0); with a unit a fraction is rounded down to whole bytes (`1.5K` is 1536)."""
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise BadSourceError(f"not a size: {text!r} (use bytes as an int, or text such as 512M, 4G, 1.5T)")
    if isinstance(text, float):
        if not text.is_integer():
            raise BadSourceError(f"not a whole number of bytes: {text!r} (use e.g. '1.5G' for 1.5 GiB)")
        text = int(text)
    if isinstance(text, int):
        size = text
    else:
        match = _SIZE.match(text)
        if not match:
            raise BadSourceError(f"not a size: {text!r} (use e.g. 512M, 4G, 1.5T)")
        number, unit = match.groups()
        if len(number) > 40:  # far beyond any cap; and int() refuses strings of 4300+ digits
            raise BadSourceError(f"size out of range: {text[:20]!r}… (must be below 8 EiB)")
        from fractions import Fraction  # parsing a size is rare; importing it costs every start

        if not unit and Fraction(number).denominator != 1:
            raise BadSourceError(f"not a whole number of bytes: {text!r} (use e.g. '1.5G' for 1.5 GiB)")
        size = int(Fraction(number) * _UNITS[unit.upper()])  # exact: a float loses the low bits
    if not 0 <= size <= MAX_SIZE:
        raise BadSourceError(f"size out of range: {text!r} (must be 0 to {MAX_SIZE} bytes, just under 8 EiB)")
    return size


def stored_size(text: str | None) -> int | None:
    """A size the index keeps as text, or None when absent or unusable (e.g. written by an older
    rq before sizes were bounded): the caller then falls back to its default."""
    if text is None or not text.isdigit() or int(text) > MAX_SIZE:
        return None
    return int(text)


def format_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


# a cgroup limit at or above this is "unlimited" (v1 writes 2**63 - 4096 rounded to pages)
_UNLIMITED = 1 << 60


def _memory_groups(root: str, proc_cgroup: str) -> list[tuple[str, str]]:
    """(directory, v1 or v2) of this process's memory cgroup and of each group above it, as far as
    they can be found (in a container the group's host path may not exist under its own mount: the
    walk up reaches the container's group at the mount's root)."""
    try:
        with open(proc_cgroup, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    groups: list[tuple[str, str]] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            base, kind = root, "v2"  # the unified hierarchy
        elif "memory" in controllers.split(","):
            base, kind = f"{root}/memory", "v1"
        else:
            continue
        rel = path.strip("/")
        while True:
            groups.append((f"{base}/{rel}" if rel else base, kind))
            if not rel:
                break
            rel = rel.rpartition("/")[0]
    return groups


def _limit_file(kind: str) -> str:
    return "memory.max" if kind == "v2" else "memory.limit_in_bytes"


def cgroup_memory_limit(root: str = "/sys/fs/cgroup", proc_cgroup: str = "/proc/self/cgroup") -> int | None:
    """The memory limit of this process's cgroup in bytes, the lowest of its group and the groups
    above it (cgroup v2 `memory.max`, v1 `memory/…/memory.limit_in_bytes`), or None when none is set
    or it cannot be read. tmpfs pages (the RAM tier) count against it: past it the kernel kills."""
    found = [_read_limit(f"{d}/{_limit_file(kind)}") for d, kind in _memory_groups(root, proc_cgroup)]
    limits = [limit for limit in found if limit is not None]
    return min(limits) if limits else None


def cgroup_memory_used(
    limit: int, root: str = "/sys/fs/cgroup", proc_cgroup: str = "/proc/self/cgroup"
) -> int:
    """What the group whose memory limit is `limit` (cgroup_memory_limit's) uses now: v2
    `memory.current`, v1 `memory.usage_in_bytes`, less the file cache the kernel drops before it
    kills anyone. Its tmpfs pages (a RAM tier's) and the memory of every process in it (a trainer
    beside rq, rq itself) count. 0 when no group has that limit (a limit given by a test) or it
    cannot be read."""
    used = 0
    for d, kind in _memory_groups(root, proc_cgroup):
        if _read_limit(f"{d}/{_limit_file(kind)}") != limit:
            continue
        usage = _read_limit(f"{d}/{'memory.current' if kind == 'v2' else 'memory.usage_in_bytes'}")
        if usage is None:
            continue
        # The page cache the kernel can drop before it kills anyone is not use: all of the file
        # cache but its tmpfs/shared-memory pages (a RAM tier's), which only a delete frees. Only
        # the inactive part was taken off: a group that had just read 350 MiB of files "used"
        # 338 MiB with no process in it, and a cache made then got a cap of a fraction (dr5).
        # v1's total_ counts the groups below too, as usage_in_bytes does.
        stat = f"{d}/memory.stat"
        if kind == "v2":
            cache, shmem = _stat_field(stat, "file"), _stat_field(stat, "shmem")
        else:
            cache, shmem = _stat_field(stat, "total_cache"), _stat_field(stat, "total_shmem")
        used = max(used, usage - min(max(0, cache - shmem), usage))
    return used


def _stat_field(path: str, name: str) -> int:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == name and value.strip().isdigit():
                    return int(value)
    except OSError:
        pass
    return 0


# What rq leaves free of a RAM file system it shares with others, whatever cap it is given: a
# tenth of it, and at least a quarter of it up to 64 MiB. Others there are DataLoader workers
# (every batch crosses /dev/shm), NCCL's shared-memory transport and torch.multiprocessing; on
# Docker's default 64 MiB /dev/shm a tier filled to 60 MiB left them too little and they died
# with "bus error" (ENOSPC on a mapped page). 64 MiB → 48 MiB for rq; 1 GiB → 922 MiB; 64 GiB → 57.6 GiB.
SHM_HEADROOM_MIN = 64 << 20


def ram_fs_share(fs_size: int) -> int:
    """The most of a RAM file system of `fs_size` bytes that rq's RAM tier takes (SHM_HEADROOM_MIN)."""
    return fs_size - max(fs_size // 10, min(SHM_HEADROOM_MIN, fs_size // 4))


def _read_limit(path: str) -> int | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            text = f.read().strip()
    except OSError:
        return None
    if not text.isdigit():
        return None  # "max", or something this version does not know
    value = int(text)
    return value if 0 < value < _UNLIMITED else None


def inodes_note(path: object) -> str:
    """ " (out of inodes …)" when the file system under `path` has no file left to give, else "":
    a full file system's message then says what ran out, since freeing or capping bytes does
    nothing for inodes (a tmpfs's nr_inodes, a small ext4 of many tiny objects)."""
    try:
        fs = os.statvfs(str(path))
    except OSError:
        return ""
    if fs.f_files == 0 or fs.f_favail > 0:  # f_files 0: no count kept (btrfs, tmpfs nr_inodes=0)
        return ""
    return " (it is out of inodes, not bytes: each cached object is a file; see `df -i`)"


def no_space_under(path: object, exc: BaseException | None, doing: str = "") -> str:
    """How a write refused for want of room under `path` is said (`doing`: " writing URL", " to make
    the …"): a disk quota used up (EDQUOT) as that, "no space left under PATH …: disk quota
    exceeded", since the file system has room and freeing or capping the tier there is not what
    helps; else (ENOSPC) "no space left on the file system under PATH …", what ran out named.
    Both begin "no space left", as every FileSystemFullError's message does."""
    if isinstance(exc, OSError) and exc.errno == errno.EDQUOT:
        return f"no space left under {path}{doing}: disk quota exceeded"
    return f"no space left on the file system under {path}{inodes_note(path)}{doing}"
