"""A redirect that is not S3's (an http endpoint a proxy sends to https, a load balancer's move: a
3xx with no S3 error code and no region) is said as what it is, exit 6 with a hint to point
--endpoint-url at its Location. It was "the bucket is in another region: set AWS_REGION" (301,
exit 4), or "HTTP 302" with "re-run to continue" (exit 6), neither of which a re-run or a region
cures."""

from __future__ import annotations

from pathlib import Path

import pytest
from s3fake import FakeS3, dry_run_against


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_a_redirect_that_is_not_s3s_names_its_location(store: FakeS3, tmp_path: Path, status: int) -> None:
    store.pages = {None: (status, {"Location": "https://u:secret@s3.example.com/b?list-type=2&t=a@b"}, b"")}
    rc, err, summary = dry_run_against(store, tmp_path / "c")
    assert rc == 6, err
    assert f"the endpoint answered HTTP {status}, a redirect to https://s3.example.com/b," in summary["error"]
    assert "secret" not in err and "AWS_REGION" not in err and "re-run" not in err, err
    assert "point --endpoint-url at the address it redirects to" in err, err
    assert err.count("\n") == 1, err
