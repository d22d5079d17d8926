"""rq's tiered cache: preload datasets from S3 or a directory into RAM (/dev/shm) and disk tiers,
and read them back verified from any process.

    from cache import Cache
    c = Cache("/mnt/nvme/rq-cache")
    with c.open("s3://bucket/train/000123.tar") as f:
        ...
"""

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

import cache.forking  # noqa: F401  (imports in flight are finished before a fork)
from cache.errors import (
    AuthError,
    BadSourceError,
    BusyError,
    CacheError,
    CacheFullError,
    ChangedError,
    DeniedError,
    FileSystemFullError,
    MisbehavingStoreError,
    NotFoundError,
    OriginError,
    RamTierUnavailableError,
    ReadOnlyCacheError,
    ThreadLimitError,
    TlsError,
    UncacheableError,
    UnreachableError,
    UnsafeDirError,
    VerifyError,
)

if TYPE_CHECKING:
    from cache.api import Cache, Prefetcher
    from cache.preload import PreloadResult


_LAZY = {"Cache": "cache.api", "Prefetcher": "cache.api", "PreloadResult": "cache.preload"}


def __getattr__(name: str) -> Any:
    """The read API and the planner load on first use, so `import cache.s3` stays light: rq preload
    starts listing with it before it pays for the rest (see cache.s3.start_listings). After a plain
    `import cache`, `cache.api`, `cache.preload`, … are there on first use too, as they were when
    this module imported them all."""
    module = _LAZY.get(name)
    if module is not None:
        return getattr(importlib.import_module(module), name)
    if not name.startswith("_") and importlib.util.find_spec(f"cache.{name}") is not None:
        return importlib.import_module(f"cache.{name}")
    raise AttributeError(f"module 'cache' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "AuthError",
    "BadSourceError",
    "BusyError",
    "Cache",
    "CacheError",
    "CacheFullError",
    "ChangedError",
    "DeniedError",
    "FileSystemFullError",
    "MisbehavingStoreError",
    "NotFoundError",
    "OriginError",
    "Prefetcher",
    "PreloadResult",
    "RamTierUnavailableError",
    "ReadOnlyCacheError",
    "ThreadLimitError",
    "TlsError",
    "UncacheableError",
    "UnreachableError",
    "UnsafeDirError",
    "VerifyError",
]
