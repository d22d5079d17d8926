"""rq sends S3 requests where a boto3 client with the same environment and profile sends them:
FIPS, dual-stack and S3 Accelerate hosts, the profile's s3 = addressing_style, bucket names that
cannot be host names (path-style), an endpoint URL beating FIPS/dual-stack; what botocore refuses
rq refuses with one line (BadSourceError, exit 2), never silently sending to another host.

Each case resolves rq's URL (cache.s3.route, no network) and compares it with the URL a boto3
client calls, caught by a `before-send` hook that answers before anything leaves the process."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from cache.errors import BadSourceError
from cache.s3 import S3Settings, resolve_credentials, route

KEY = "k/a b"


class _Sent(Exception):
    pass


def boto3_url(bucket: str) -> str:
    """The URL boto3 would call for a HEAD of bucket/KEY, or 'refused: …'."""
    import boto3
    import botocore.config
    import botocore.exceptions

    def hook(request: Any, **_: Any) -> None:
        raise _Sent(request.url)

    try:
        # (rq always uses the regional us-east-1 host, as botocore does with this setting)
        config = botocore.config.Config(s3={"us_east_1_regional_endpoint": "regional"})
        client = boto3.session.Session().client("s3", config=config)
        client.meta.events.register("before-send", hook)
        client.head_object(Bucket=bucket, Key=KEY)
    except _Sent as sent:
        return str(sent.args[0])
    except (botocore.exceptions.BotoCoreError, ValueError) as exc:
        return f"refused: {exc}"
    raise AssertionError("boto3 sent nothing")


def rq_url(bucket: str) -> str:
    try:
        return route(resolve_credentials(S3Settings())).url(bucket, KEY)
    except BadSourceError as exc:
        return f"refused: {exc}"


@pytest.fixture
def aws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Sets the environment and profile of one case: aws(profile_lines, **env)."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)

    def setup(profile: str = "", **env: str) -> None:
        config = tmp_path / "config"
        config.write_text(f"[default]\n{profile}\n")
        (tmp_path / "credentials").write_text("")
        monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
        if "region" not in profile and "AWS_DEFAULT_REGION" not in env:
            # (rq's default region; boto3 has none, and then uses the global us-east-1 host)
            monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        for name, value in env.items():
            monkeypatch.setenv(name, value)

    return setup


FIPS = {"AWS_USE_FIPS_ENDPOINT": "true"}
DUAL = {"AWS_USE_DUALSTACK_ENDPOINT": "true"}
ACCEL = "s3 =\n    use_accelerate_endpoint = true"
PATH = "s3 =\n    addressing_style = path"
VIRTUAL = "s3 =\n    addressing_style = virtual"
LOCAL = {"AWS_ENDPOINT_URL": "http://localhost:24750"}

CASES: list[tuple[str, dict[str, str], str]] = [
    # (profile lines, environment, bucket)
    ("", {}, "bkt"),
    ("", FIPS, "bkt"),
    ("use_fips_endpoint = true", {}, "bkt"),
    ("use_fips_endpoint = true", {"AWS_USE_FIPS_ENDPOINT": "false"}, "bkt"),  # the environment first
    ("", DUAL, "bkt"),
    ("use_dualstack_endpoint = true", {}, "bkt"),
    ("s3 =\n    use_dualstack_endpoint = true", {}, "bkt"),
    ("", {**FIPS, **DUAL}, "bkt"),
    (ACCEL, {}, "bkt"),
    (ACCEL, DUAL, "bkt"),
    (ACCEL, FIPS, "bkt"),  # refused by both
    (ACCEL, {}, "a.b"),  # refused by both
    (ACCEL, {}, "My_Legacy_Bucket"),
    (ACCEL + "\n    addressing_style = path", {}, "bkt"),  # Accelerate wins
    ("region = eu-west-1", FIPS, "bkt"),
    ("", {"AWS_DEFAULT_REGION": "eu-central-1", **DUAL}, "bkt"),
    ("region = cn-north-1", {}, "bkt"),
    ("region = cn-north-1", DUAL, "bkt"),
    ("region = cn-north-1", FIPS, "bkt"),  # refused by both
    ("region = cn-north-1\n" + ACCEL, {}, "bkt"),  # refused by both
    ("region = us-gov-west-1", FIPS, "bkt"),
    ("region = us-gov-west-1", {**FIPS, **DUAL}, "bkt"),
    ("region = us-iso-east-1", FIPS, "bkt"),
    ("region = eusc-de-east-1", DUAL, "bkt"),
    (PATH, {}, "bkt"),
    (PATH, FIPS, "bkt"),
    (PATH, DUAL, "bkt"),
    (VIRTUAL, {}, "bkt"),
    ("", {}, "My_Legacy_Bucket"),
    ("", {}, "a.b"),
    (VIRTUAL, {}, "a.b"),
    (VIRTUAL, {}, "My_Legacy_Bucket"),
    ("", FIPS, "My_Legacy_Bucket"),
    ("", {}, "ab"),
    ("", {}, "-abc"),
    ("", {}, "192.168.5.4"),
    ("", {}, "a" * 64),
    ("", {}, "a--b"),
    ("", LOCAL, "bkt"),
    (VIRTUAL, LOCAL, "bkt"),
    (VIRTUAL, LOCAL, "a.b"),
    (VIRTUAL, LOCAL, "My_Legacy_Bucket"),
    (VIRTUAL, {"AWS_ENDPOINT_URL": "http://localhost:24750/base/"}, "bkt"),
    (VIRTUAL, {"AWS_ENDPOINT_URL": "https://localhost:24750"}, "a.b"),
    (VIRTUAL, {"AWS_ENDPOINT_URL": "http://127.0.0.1:24750"}, "bkt"),
    (VIRTUAL, {"AWS_ENDPOINT_URL": "http://[::1]:24750"}, "bkt"),
    ("s3 =\n    addressing_style = auto", LOCAL, "bkt"),
    (PATH, LOCAL, "bkt"),
    ("", {**LOCAL, **FIPS, **DUAL}, "bkt"),  # an endpoint URL beats FIPS and dual-stack
    (ACCEL, LOCAL, "bkt"),  # refused by both
    ("", {"AWS_ENDPOINT_URL": "https://s3.us-west-2.amazonaws.com"}, "bkt"),
    ("", {"AWS_ENDPOINT_URL": "https://s3-accelerate.amazonaws.com"}, "bkt"),
    ("", {"AWS_ENDPOINT_URL": "https://s3-accelerate.amazonaws.com"}, "a.b"),
    ("", {"AWS_ENDPOINT_URL": "http://localhost:24750/?x=1"}, "bkt"),  # refused by both
    ("s3 =\n    addressing_style = sideways", {}, "bkt"),  # refused by both
    ("", {"AWS_DEFAULT_REGION": "us east"}, "bkt"),  # refused by both
    # botocore's pseudo-regions (dr6: rq built s3.aws-global.amazonaws.com, s3.fips-us-gov-west-1…)
    ("region = aws-global", {}, "bkt"),
    ("region = aws-global", FIPS, "bkt"),
    ("region = aws-global", DUAL, "bkt"),
    ("region = fips-us-gov-west-1", {}, "bkt"),
    ("region = us-gov-west-1-fips", {}, "bkt"),
    ("region = us-east-1-fips", {}, "bkt"),
    ("region = us-east-1-fips", DUAL, "bkt"),
    ("region = us-east-1-fips", LOCAL, "bkt"),
]


@pytest.mark.parametrize(("profile", "env", "bucket"), CASES)
def test_rq_sends_where_boto3_sends(aws: Any, profile: str, env: dict[str, str], bucket: str) -> None:
    aws(profile, **env)
    expected, got = boto3_url(bucket), rq_url(bucket)
    if expected.startswith("refused"):
        assert got.startswith("refused"), (expected, got)
        assert "\n" not in got
    else:
        assert got == expected


def test_the_reviewers_three_hosts(aws: Any) -> None:
    """The hosts the review found ignored (rq called bkt.s3.us-east-1.amazonaws.com for all)."""
    aws("", **FIPS)
    assert rq_url("bkt") == "https://bkt.s3-fips.us-east-1.amazonaws.com/k/a%20b"
    aws("", AWS_USE_FIPS_ENDPOINT="false", **DUAL)
    assert rq_url("bkt") == "https://bkt.s3.dualstack.us-east-1.amazonaws.com/k/a%20b"
    aws(ACCEL, AWS_USE_DUALSTACK_ENDPOINT="false")
    assert rq_url("bkt") == "https://bkt.s3-accelerate.amazonaws.com/k/a%20b"


def test_accelerate_refusals_name_the_setting(aws: Any) -> None:
    aws(ACCEL, **FIPS)
    assert "Accelerate" in rq_url("bkt") and "FIPS" in rq_url("bkt")
    aws(ACCEL, AWS_USE_FIPS_ENDPOINT="false")
    said = rq_url("My_Legacy_Bucket")
    assert said.startswith("refused") and "My_Legacy_Bucket" in said


def test_a_query_in_the_endpoint_url_is_refused_on_the_command_line(tmp_path: Path) -> None:
    """--endpoint-url with a query: exit 2, one line (the query was dropped without a word)."""
    from rqtest import run_rq

    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env |= {"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b", "RQ_CACHE_DIR": str(tmp_path / "c")}
    for url in ("http://127.0.0.1:24751/?x=1", "http://127.0.0.1:24751/#frag"):
        proc = run_rq("preload", "s3://bkt/p/", "--endpoint-url", url, env=env, timeout=60)
        err = proc.stderr.decode()
        assert proc.returncode == 2, err
        assert "query or fragment" in err
        assert len(err.strip().splitlines()) <= 2  # the line, and at most a hint
