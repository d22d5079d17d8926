"""`rq preload` starts the S3 listing before it imports the rest of the cache; that early listing
is narrowed by --include too (cache.s3.list_prefix), so the CLI sends no request for the whole
SOURCE prefix that nothing reads (the library's own listing was narrowed by e686834, the CLI's
early one was not)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rqtest import popen_rq_with

# every ListObjectsV2 Prefix the rq process sends, one per line
RECORD = """
from cache.s3 import Listing
_ask = Listing._ask
def _counted(self, token):
    with open({out!r}, "a") as fh:
        fh.write(self._prefix + "\\n")
    _ask(self, token)
Listing._ask = _counted
"""


@pytest.mark.integration
def test_the_cli_lists_only_the_narrowed_prefix(
    cache_env: dict[str, str], s3_client: Any, bucket: str, tmp_path: Path
) -> None:
    for key in ("p/shard-000.bin", "p/shard-001.bin", "p/other.bin"):
        s3_client.put_object(Bucket=bucket, Key=key, Body=b"x")
    out = tmp_path / "prefixes"
    proc = popen_rq_with(
        RECORD.format(out=str(out)),
        "preload",
        f"s3://{bucket}/p/",
        "--include",
        "shard-00*",
        "--json",
        env=cache_env,
    )
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr.decode()
    assert b'"objects":2,' in stdout, stdout
    asked = out.read_text().split()
    assert asked and set(asked) == {"p/shard-00"}, asked
