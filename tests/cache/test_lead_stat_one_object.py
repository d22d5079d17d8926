"""`Cache.stat` and `Cache.path` answered a prefix or a bare bucket with NotFoundError ("not
cached"), where `Cache.open` and the CLI say the URL names no single object: a caller looping over
URLs could not tell a typo'd prefix from a miss. All three now refuse them with BadSourceError."""

from __future__ import annotations

from pathlib import Path

import pytest

from cache import Cache
from cache.errors import BadSourceError, NotFoundError


@pytest.mark.parametrize("url", ["s3://bucket/train/", "s3://bucket", "s3://bucket/"])
def test_stat_and_path_refuse_a_prefix_or_a_bucket_as_open_does(tmp_path: Path, url: str) -> None:
    with Cache(tmp_path / "c", ram_dir=tmp_path / "ram") as c:
        for call in (c.stat, c.path, c.open):
            with pytest.raises(BadSourceError, match=r"prefix|bucket"):
                call(url)


def test_one_cached_object_is_still_found_and_a_miss_is_still_not_found(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "a").write_bytes(b"x" * 100)
    with Cache(tmp_path / "c", ram_dir=tmp_path / "ram") as c:
        c.preload([str(src) + "/"], tier="disk")
        url = str(src / "d" / "a")
        assert c.stat(url).size == 100
        assert c.path(url).read_bytes() == b"x" * 100
        with pytest.raises(NotFoundError):
            c.stat(str(src / "d" / "b"))
        # a local directory is a path: normalised without its slash, it is simply not cached
        with pytest.raises(NotFoundError):
            c.stat(str(src / "d") + "/")
