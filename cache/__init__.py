"""rq's tiered cache: preload datasets from S3 or a directory into RAM (/dev/shm) and disk tiers,
and read them back verified from any process.

    from cache import Cache
    c = Cache("/mnt/nvme/rq-cache")
    with c.open("s3://bucket/train/000123.tar") as f:
        ...
"""

from cache.api import Cache, Prefetcher
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
from cache.preload import PreloadResult

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
