"""rq's tiered cache: preload datasets from S3 or a directory into RAM (/dev/shm) and disk tiers,
and read them back verified from any process.

    from cache import Cache
    c = Cache("/mnt/nvme/rq-cache")
    with c.open("s3://bucket/train/000123.tar") as f:
        ...
"""

from typing import TYPE_CHECKING, Any

from cache.errors import (
    AuthError,
    BadSourceError,
    BusyError,
    CacheError,
    CacheFullError,
    ChangedError,
    NotFoundError,
    OriginError,
    UnreachableError,
    UnsafeDirError,
    VerifyError,
)

if TYPE_CHECKING:
    from cache.api import Cache, Prefetcher
    from cache.preload import PreloadResult


def __getattr__(name: str) -> Any:
    """The read API and the planner load on first use, so `import cache.s3` stays light: rq preload
    starts listing with it before it pays for the rest (see cache.s3.start_listings)."""
    if name in ("Cache", "Prefetcher"):
        from cache import api

        return getattr(api, name)
    if name == "PreloadResult":
        from cache.preload import PreloadResult

        return PreloadResult
    raise AttributeError(f"module 'cache' has no attribute {name!r}")


__all__ = [
    "AuthError",
    "BadSourceError",
    "BusyError",
    "Cache",
    "CacheError",
    "CacheFullError",
    "ChangedError",
    "NotFoundError",
    "OriginError",
    "Prefetcher",
    "PreloadResult",
    "UnreachableError",
    "UnsafeDirError",
    "VerifyError",
]
