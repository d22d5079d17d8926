"""`rq cache cat` of a miss whose fetch fails verification: nothing was cached, so the hint must
not send the user to `rq cache verify` (it said "re-run to fetch again; `rq cache verify` lists
corrupt entries"). The failed verification is raised in the rq process in place of the fetch."""

from __future__ import annotations

from typing import Any

import pytest
from rqtest import popen_rq_with

from rqcli.exitcodes import ExitCode

pytestmark = pytest.mark.integration

CORRUPT_FETCH = (
    "import cache.api\n"
    "from cache import VerifyError\n"
    "def corrupt(self, url, *a, **k):\n"
    "    raise VerifyError(url + ': the body does not match its digest')\n"
    "cache.api.Cache._fetch_one = corrupt"
)


def test_a_miss_that_fails_verification_names_no_corrupt_entry(
    s3_client: Any, bucket: str, cache_env: dict[str, str]
) -> None:
    s3_client.put_object(Bucket=bucket, Key="a.bin", Body=b"x" * 100)
    proc = popen_rq_with(CORRUPT_FETCH, "cache", "cat", f"s3://{bucket}/a.bin", env=cache_env)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == ExitCode.VERIFY, err
    assert out == b""
    assert b"does not match its digest" in err and b"re-run to fetch again" in err, err
    assert b"rq cache verify" not in err, err


def test_an_index_that_cannot_answer_after_a_failed_verification_is_no_traceback(
    s3_client: Any, bucket: str, cache_env: dict[str, str]
) -> None:
    """The hint's look at the index (Cache.stat) failing in its turn was raised from inside the
    handler: an uncaught CacheError, not the verification's one line and exit 5."""
    s3_client.put_object(Bucket=bucket, Key="a.bin", Body=b"x" * 100)
    setup = CORRUPT_FETCH + (
        "\nfrom cache import CacheError\n"
        "def busy(self, url):\n"
        "    raise CacheError('the index is busy')\n"
        "cache.api.Cache.stat = busy"
    )
    proc = popen_rq_with(setup, "cache", "cat", f"s3://{bucket}/a.bin", env=cache_env)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == ExitCode.VERIFY, err
    assert err.decode().startswith("rq: error: ") and len(err.decode().strip().splitlines()) == 1, err
    assert b"does not match its digest" in err and b"Traceback" not in err, err
