"""AWS's other ways of saying "the bucket is in another region": a 307 TemporaryRedirect (a bucket
created moments ago in another region), and a body-less reply to a HEAD (301, 307 or 400) that names
the region only in its x-amz-bucket-region header or its Location. Each is exit 4 in one line with
"set AWS_REGION=REGION", as PermanentRedirect and AuthorizationHeaderMalformed were; the 307 was
"HTTP 307 …" (exit 6) and the body-less ones never named the region."""

from __future__ import annotations

from pathlib import Path

import pytest
from s3fake import FakeS3, dry_run_against

from cache import Cache
from cache.errors import AuthError, OriginError
from cache.s3 import map_error

REGION_HEADER = {"x-amz-bucket-region": "eu-west-2", "Content-Type": "application/xml"}


def temporary_redirect(endpoint: str = "") -> bytes:
    where = f"<Endpoint>{endpoint}</Endpoint>" if endpoint else ""
    return (
        '<?xml version="1.0" encoding="UTF-8"?><Error><Code>TemporaryRedirect</Code><Message>Please '
        "re-send this request to the specified temporary endpoint. Continue to use the original "
        f"request endpoint for future requests.</Message>{where}<Bucket>b</Bucket></Error>"
    ).encode()


@pytest.mark.parametrize(
    ("headers", "body"),
    [
        ({"Content-Type": "application/xml"}, temporary_redirect("b.s3-eu-west-2.amazonaws.com")),
        (REGION_HEADER, temporary_redirect()),
    ],
    ids=["endpoint-in-body", "region-header"],
)
def test_a_listing_redirected_with_307_is_exit_4_naming_the_region(
    store: FakeS3, tmp_path: Path, headers: dict[str, str], body: bytes
) -> None:
    store.pages = {None: (307, headers, body)}
    rc, err, summary = dry_run_against(store, tmp_path / "c")
    # old: exit 6, "s3://b: HTTP 307 TemporaryRedirect Please re-send this request …"
    assert rc == 4, err
    assert "another region (eu-west-2): set AWS_REGION=eu-west-2" in summary["error"]
    assert err.count("\n") == 1, err


@pytest.mark.parametrize(
    ("status", "headers"),
    [
        (400, REGION_HEADER),
        (301, REGION_HEADER),
        (307, {"Location": "https://b.s3.eu-west-2.amazonaws.com/p/a"}),
    ],
    ids=["400-header", "301-header", "307-location"],
)
def test_a_body_less_head_refusal_names_the_region_from_its_headers(
    store: FakeS3, tmp_path: Path, status: int, headers: dict[str, str]
) -> None:
    store.objects = {"p/a": (status, headers, b"")}
    with Cache(tmp_path / "c", ram_dir=tmp_path / "ram", endpoint_url=store.endpoint) as c:
        # old: OriginError "s3://b/p/a: HTTP 400" / "HTTP 307"; the 301 was an AuthError naming no region
        with pytest.raises(AuthError, match=r"another region \(eu-west-2\): set AWS_REGION=eu-west-2 "):
            c.open("s3://b/p/a")
        assert c.entries() == []


def test_a_region_header_naming_the_region_signed_for_is_no_redirect() -> None:
    err = map_error(
        "s3://b/k", None, 400, None, "http://x", [("x-amz-bucket-region", "us-east-1")], "us-east-1"
    )
    assert isinstance(err, OriginError) and not isinstance(err, AuthError), err
    err = map_error(
        "s3://b/k", None, 400, None, "http://x", [("X-Amz-Bucket-Region", "eu-west-2")], "us-east-1"
    )
    assert isinstance(err, AuthError) and "AWS_REGION=eu-west-2" in str(err)
