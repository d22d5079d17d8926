"""A store that fails every GET (500 InternalError, 503 SlowDown) after the retries is the same
outage for `rq preload` and `rq cache cat`, so the same exit code: 6 ("the store kept failing;
re-run"). Preload gave 1 ("N of N objects failed", kind `origin`) while cat gave 6. Real
SeaweedFS behind the fault proxy, only object GETs faulted (the listing and HEADs answer)."""

from __future__ import annotations

from typing import Any

import pytest
from rqtest import popen_rq_with

from rqcli.exitcodes import ExitCode

pytestmark = pytest.mark.integration


# retries as they are, fewer of them: one attempt per object, one CRT retry (26 s a case otherwise)
FEWER_RETRIES = (
    "import cache.fetcher, cache.s3\n"
    "cache.fetcher.MAX_ATTEMPTS = 1\n"
    "cache.s3.S3Settings.__init__.__defaults__ = (None, None, None, 1)"
)


def _rq(env: dict[str, str], *args: str) -> tuple[int, bytes]:
    proc = popen_rq_with(FEWER_RETRIES, *args, env=env)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


@pytest.mark.parametrize("internal_error", [True, False])
def test_preload_and_cat_give_a_failing_store_the_same_exit_code(
    internal_error: bool, s3_client: Any, bucket: str, cache_env: dict[str, str], proxy_factory: Any
) -> None:
    for i in range(2):
        s3_client.put_object(Bucket=bucket, Key=f"d/{i}.bin", Body=b"x" * 100)
    sick = proxy_factory(p_slowdown=1.0, only_objects=True, internal_error=internal_error)
    env = {**cache_env, "AWS_ENDPOINT_URL": sick.endpoint}
    pre_rc, pre_err = _rq(env, "preload", f"s3://{bucket}/d/")
    assert (
        "2 of 2 objects failed — the source kept failing or was lost: re-run the same command".encode()
        in pre_err
    ), pre_err
    assert pre_rc == ExitCode.UNREACHABLE, pre_err  # old: 1
    cat_rc, cat_err = _rq(env, "cache", "cat", f"s3://{bucket}/d/0.bin")
    assert cat_rc == ExitCode.UNREACHABLE, cat_err
    assert sick.stats.slowdowns >= 2


def test_mixed_kinds_exit_with_the_code_they_share() -> None:
    from rqcli.commands.preload import exit_for_kinds

    assert exit_for_kinds({"origin", "unreachable"}) == ExitCode.UNREACHABLE
    assert exit_for_kinds({"verify", "changed"}) == ExitCode.VERIFY
    assert exit_for_kinds({"origin", "not_found"}) == ExitCode.FAILURE
    assert exit_for_kinds({"bad_name"}) == ExitCode.FAILURE
    assert exit_for_kinds({"not_found"}) == ExitCode.NOT_FOUND
