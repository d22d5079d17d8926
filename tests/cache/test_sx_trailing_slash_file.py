"""A source with a trailing `/` names a directory or prefix, never a file: `rq preload
s3://b/key.bin/` found nothing (exit 3, "no objects under …") while `rq preload dir/file.bin/`
cached the file (pathlib drops the slash). Both now refuse it with one line that names the
object without the slash (exit 3); without the slash both cache it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cache import Cache
from cache.errors import NotFoundError
from cache.preload import check_sources_exist
from cache.s3 import S3Settings


def test_a_local_file_with_a_trailing_slash_is_refused(tmp_path: Path, ram_dir: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "file.bin").write_bytes(b"x" * 10)
    f = tmp_path / "d" / "file.bin"
    said = f"^no files under {f}/: {f} is a file, not a directory \\(drop the trailing /\\)$"
    with pytest.raises(NotFoundError, match=said):
        check_sources_exist([f"{f}/"], S3Settings())
    with Cache(tmp_path / "c", ram_dir=ram_dir) as c:
        with pytest.raises(NotFoundError, match=said):
            c.preload([f"{f}/"])
        assert c.preload([str(f)]).objects == 1
        assert c.preload([f"{tmp_path / 'd'}/"]).skipped == 1  # (a directory's slash is fine)


@pytest.mark.integration
def test_an_s3_object_with_a_trailing_slash_is_named(
    cache_env: dict[str, str], services: Any, s3_client: Any, bucket: str
) -> None:
    s3_client.put_object(Bucket=bucket, Key="dir/key.bin", Body=b"x" * 10)
    settings = S3Settings(endpoint_url=services.s3_endpoint)
    said = (
        f"^no objects under s3://{bucket}/dir/key.bin/: s3://{bucket}/dir/key.bin is an object, "
        "not a prefix \\(drop the trailing /\\)$"
    )
    with pytest.raises(NotFoundError, match=said):
        check_sources_exist([f"s3://{bucket}/dir/key.bin/"], settings)
    with Cache(Path(cache_env["RQ_CACHE_DIR"])) as c:
        with pytest.raises(NotFoundError, match=said):
            c.preload([f"s3://{bucket}/dir/key.bin/"])
        with pytest.raises(NotFoundError, match=f"^no objects under s3://{bucket}/nope/$"):
            c.preload([f"s3://{bucket}/nope/"])
        assert c.preload([f"s3://{bucket}/dir/key.bin"]).objects == 1
