"""What rq sends to an S3 store and how it takes its refusals, against a tiny local HTTP stub:
the signing region and endpoint from ~/.aws/config, token and region errors (exit 4, no retry),
credential_process failures (exit 4, one line, the --json summary), and an endpoint URL with
user info (exit 2, the secret never shown)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from rqtest import run_rq, s3_stub

from cache.errors import AuthError
from cache.s3 import map_error


def aws_variables() -> list[str]:
    """The variables that steer boto3 here (none of this process's may reach rq)."""
    return [name for name in os.environ if name.startswith("AWS_") or name == "REQUESTS_CA_BUNDLE"]


LISTING = (
    b'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
    b"<Name>b</Name><Prefix>d/</Prefix><KeyCount>1</KeyCount><MaxKeys>1000</MaxKeys><IsTruncated>false</IsTruncated>"
    b'<Contents><Key>d/a</Key><LastModified>2024-01-01T00:00:00.000Z</LastModified><ETag>"0cc175b9c0f1b6a831c399e269772661"</ETag>'
    b"<Size>1</Size><StorageClass>STANDARD</StorageClass></Contents></ListBucketResult>"
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No AWS variable of this process reaches rq (run_rq starts from os.environ)."""
    for name in aws_variables():
        monkeypatch.delenv(name, raising=False)


def rq_env(tmp_path: Path, config: str = "", keys: bool = True) -> dict[str, str]:
    home = tmp_path / "home"
    (home / ".aws").mkdir(parents=True)
    (home / ".aws" / "config").write_text(config)
    env = {
        "HOME": str(home),
        "AWS_CONFIG_FILE": str(home / ".aws" / "config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(home / ".aws" / "credentials"),
        "RQ_CACHE_DIR": str(tmp_path / "cache"),
    }
    if keys:
        env |= {"AWS_ACCESS_KEY_ID": "AKIDSTUB", "AWS_SECRET_ACCESS_KEY": "stubsecret"}
    return env


def dry_run(env: dict[str, str], *flags: str) -> tuple[int, dict[str, Any], str]:
    res = run_rq("preload", "s3://b/d/", "--dry-run", "--json", *flags, env=env, timeout=60)
    lines = res.stdout.decode().strip().splitlines()
    summary = json.loads(lines[-1]) if lines else {}
    return res.returncode, summary, res.stderr.decode()


def test_signing_region_and_endpoint_from_config(tmp_path: Path) -> None:
    with s3_stub(200, LISTING) as (port, seen):
        env = rq_env(tmp_path, f"[default]\nregion = eu-west-3\nendpoint_url = http://127.0.0.1:{port}\n")
        rc, summary, err = dry_run(env)
        # old: https://s3.us-east-1.amazonaws.com, signed us-east-1 (exit 6, cannot reach)
        assert rc == 0 and summary["objects"] == 1, err
    assert seen and "/eu-west-3/s3/aws4_request" in seen[0]["authorization"]


def region_error(code: str, extra: str) -> bytes:
    return f"<Error><Code>{code}</Code><Message>wrong region</Message>{extra}</Error>".encode()


@pytest.mark.parametrize(
    ("status", "body", "wanted"),
    [
        (400, region_error("InvalidToken", ""), "InvalidToken"),
        (400, region_error("TokenRefreshRequired", ""), "TokenRefreshRequired"),
        (
            400,
            region_error("AuthorizationHeaderMalformed", "<Region>eu-central-1</Region>"),
            "AWS_REGION=eu-central-1",
        ),
        (
            301,
            region_error("PermanentRedirect", "<Endpoint>b.s3.ap-east-1.amazonaws.com</Endpoint>"),
            "AWS_REGION=ap-east-1",
        ),
    ],
    ids=["InvalidToken", "TokenRefreshRequired", "AuthorizationHeaderMalformed", "PermanentRedirect"],
)
def test_token_and_region_errors_exit_auth(tmp_path: Path, status: int, body: bytes, wanted: str) -> None:
    with s3_stub(status, body) as (port, _):
        rc, summary, err = dry_run(rq_env(tmp_path), "--endpoint-url", f"http://127.0.0.1:{port}")
    # old: exit 6 "the store kept failing; re-run to continue"
    assert rc == 4 and wanted in summary["error"] and err.count("\n") == 1, err


def test_map_error_region_hint_without_a_body() -> None:
    err = map_error("s3://b/k", None, 301, None, "http://x")
    assert isinstance(err, AuthError) and "another region" in str(err)


def credential_process_config(tmp_path: Path, output: str) -> str:
    script = tmp_path / "creds.py"
    script.write_text(f"import sys\nsys.stdout.write({output!r})\n")
    return f"[profile cp]\ncredential_process = {sys.executable} {script}\n"


@pytest.mark.parametrize(
    ("output", "wanted"),
    [
        (
            json.dumps(
                {
                    "Version": 1,
                    "AccessKeyId": "a",
                    "SecretAccessKey": "s",
                    "Expiration": "2020-01-01T00:00:00Z",
                }
            ),
            "expired",
        ),
        ("not json", "credential_process output invalid"),
    ],
    ids=["expired", "not-json"],
)
def test_credential_process_failures_exit_auth(tmp_path: Path, output: str, wanted: str) -> None:
    env = rq_env(tmp_path, credential_process_config(tmp_path, output), keys=False) | {"AWS_PROFILE": "cp"}
    rc, summary, err = dry_run(env, "--endpoint-url", "http://127.0.0.1:21512")
    # old: exit 1 "unexpected RuntimeError …" / "unexpected JSONDecodeError", no summary line
    assert rc == 4 and wanted in summary.get("error", ""), err
    assert err.count("\n") == 1 and "unexpected" not in err


def test_endpoint_userinfo_never_shown(tmp_path: Path) -> None:
    url = "http://ak:SecretInUrl@127.0.0.1:21513"
    res = run_rq(
        "-v", "preload", "s3://b/d/", "--dry-run", "--json", "--endpoint-url", url, env=rq_env(tmp_path)
    )
    out = res.stdout.decode() + res.stderr.decode()
    assert res.returncode == 2 and "user info" in out, out  # old: exit 6, the URL in the summary
    assert "SecretInUrl" not in out and "127.0.0.1:21513" in out
