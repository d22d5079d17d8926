"""Cache.open (and so `rq cache cat`) raised a bare CacheError for a miss that failed in any way
but not_found/denied/uncacheable: an object bigger than the tier's cap ("disk tier cap is 8.0 KiB;
16.0 KiB cannot fit") exited 1 where rq preload exits 7. Each failure kind is now raised as its
documented class (cache.errors.error_for), so both give the same exit code."""

from __future__ import annotations

from pathlib import Path

import pytest
from rqtest import run_rq

from cache import Cache
from cache.errors import (
    CacheError,
    CacheFullError,
    ChangedError,
    FileSystemFullError,
    OriginError,
    UnreachableError,
    VerifyError,
    error_for,
    error_kind,
)


def test_an_object_bigger_than_the_cap_is_cache_full(tmp_path: Path, cache_env: dict[str, str]) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(b"x" * 16384)
    cache = Cache(cache_env["RQ_CACHE_DIR"], disk_limit=8192)
    try:
        with pytest.raises(CacheFullError, match="cannot fit"):
            cache.open(str(big))
    finally:
        cache.close()
    proc = run_rq("cache", "cat", str(big), env=cache_env)
    assert proc.returncode == 7, proc.stderr.decode()
    assert proc.stdout == b""


@pytest.mark.parametrize(
    "exc",
    [
        CacheFullError("disk tier cap is 8.0 KiB"),
        FileSystemFullError("no space left on the file system under /x"),
        VerifyError("bad digest"),
        ChangedError("changed"),
        UnreachableError("gone"),
        OriginError("500"),
    ],
)
def test_each_kind_comes_back_as_its_class(exc: CacheError) -> None:
    again = error_for(error_kind(exc), str(exc))
    assert type(again) is type(exc)
    assert str(again) == str(exc)
