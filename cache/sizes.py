"""Human sizes: `512M`, `4GiB`, `1.5T`, plain bytes; and back."""

from __future__ import annotations

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


def cgroup_memory_limit(root: str = "/sys/fs/cgroup", proc_cgroup: str = "/proc/self/cgroup") -> int | None:
    """The memory limit of this process's cgroup in bytes, the lowest of its group and the groups
    above it (cgroup v2 `memory.max`, v1 `memory/…/memory.limit_in_bytes`), or None when none is set
    or it cannot be read. tmpfs pages (the RAM tier) count against it: past it the kernel kills."""
    try:
        with open(proc_cgroup, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    found: list[int] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            base, name = root, "memory.max"  # v2 (the unified hierarchy)
        elif "memory" in controllers.split(","):
            base, name = f"{root}/memory", "memory.limit_in_bytes"
        else:
            continue
        rel = path.strip("/")
        while True:
            # (in a container the group's host path may not exist under its own mount: the walk
            # up reaches the container's group at the mount's root)
            limit = _read_limit(f"{base}/{rel}/{name}" if rel else f"{base}/{name}")
            if limit is not None:
                found.append(limit)
            if not rel:
                break
            rel = rel.rpartition("/")[0]
    return min(found) if found else None


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
