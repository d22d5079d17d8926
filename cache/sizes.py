"""Human sizes: `512M`, `4GiB`, `1.5T`, plain bytes; and back."""

from __future__ import annotations

import re

from cache.errors import BadSourceError

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """Bytes from `text`; units are binary (K = 1024) whether written `K`, `KB` or `KiB`."""
    if isinstance(text, int):
        return text
    match = _SIZE.match(text)
    if not match:
        raise BadSourceError(f"not a size: {text!r} (use e.g. 512M, 4G, 1.5T)")
    number, unit = match.groups()
    return int(float(number) * _UNITS[unit.upper()])


def format_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
