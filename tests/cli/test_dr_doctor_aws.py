"""rq doctor resolves AWS settings as rq preload does (cache.s3.resolve_credentials), against a
tiny local HTTP stub with fixed answers: the profile's endpoint, credential_process failures,
unasked checks that only warn, an endpoint URL's secret never shown, RQ_NATS_URL over [doctor]."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from rqtest import rq_command, s3_stub

BUCKETS = (
    b'<?xml version="1.0" encoding="UTF-8"?><ListAllMyBucketsResult>'
    b"<Owner><ID>o</ID></Owner><Buckets></Buckets></ListAllMyBucketsResult>"
)
DENIED = b"<Error><Code>AccessDenied</Code><Message>no</Message></Error>"
NO_BUCKET = b"<Error><Code>NoSuchBucket</Code><Message>no</Message></Error>"


def doctor(home: Path, *args: str, config: str = "", **env: str) -> tuple[int, str, str]:
    """`rq doctor ARGS` with HOME, AWS_CONFIG_FILE and AWS_SHARED_CREDENTIALS_FILE under `home`,
    none of this process's AWS_* / RQ_* variables, and ~/.aws/config holding `config`."""
    (home / ".aws").mkdir(parents=True, exist_ok=True)
    (home / ".aws" / "config").write_text(config)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "RQ_", "NATS_"))}
    base.pop("REQUESTS_CA_BUNDLE", None)
    full = {
        **base,
        "CI": "1",
        "HOME": str(home),
        "AWS_CONFIG_FILE": str(home / ".aws" / "config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(home / ".aws" / "credentials"),
        "RQ_CONFIG": "/dev/null",
        "RQ_CACHE_DIR": str(home / "cache"),
        **env,
    }
    proc = subprocess.run(
        [*rq_command(), "doctor", *args], env=full, capture_output=True, timeout=60, check=False
    )
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode()


def events(stdout: str) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    lines = [json.loads(line) for line in stdout.splitlines() if line.strip()]
    findings = {e["check"]: e for e in lines if e.get("event") == "finding"}
    summary = next(e for e in lines if e.get("event") == "summary")
    return findings, summary


KEYS = {"AWS_ACCESS_KEY_ID": "rqtestaccesskey", "AWS_SECRET_ACCESS_KEY": "rqtestsecretkey"}


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


def test_profile_endpoint_with_env_keys_is_the_one_checked(home: Path) -> None:
    with s3_stub(200, BUCKETS) as (port, _):
        config = f"[default]\nendpoint_url = http://127.0.0.1:{port}\n"
        _rc, out, _err = doctor(home, "--json", config=config, **KEYS)
    findings, _ = events(out)
    s3 = findings["s3"]
    assert f"http://127.0.0.1:{port}" in s3["detail"], s3
    assert s3["status"] == "ok", s3


@pytest.mark.parametrize(
    "printed",
    [
        "not json",
        '{"Version": 1, "AccessKeyId": "a", "SecretAccessKey": "b", "SessionToken": "c", '
        '"Expiration": "2000-01-01T00:00:00Z"}',
    ],
    ids=["non-json", "expired"],
)
def test_credential_process_failure_is_an_s3_finding(home: Path, printed: str) -> None:
    home.mkdir(parents=True)
    script = home / "creds.sh"
    script.write_text(f"#!/bin/sh\ncat <<'EOF'\n{printed}\nEOF\n")
    script.chmod(0o755)
    with s3_stub(200, BUCKETS) as (port, _):
        config = f"[default]\ncredential_process = {script}\n"
        rc, out, err = doctor(home, "--json", "--endpoint-url", f"http://127.0.0.1:{port}", config=config)
    assert "unexpected" not in err, err
    findings, summary = events(out)
    assert findings["s3"]["status"] == "fail", findings["s3"]
    assert "credential" in findings["s3"]["detail"], findings["s3"]
    assert "s3" in summary["failures"]
    assert rc == 4, err


def test_refused_credentials_from_the_environment_only_warn(home: Path) -> None:
    with s3_stub(403, DENIED) as (port, _):
        rc, out, err = doctor(home, "--json", AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", **KEYS)
    findings, summary = events(out)
    assert findings["s3"]["status"] == "warn", findings["s3"]
    assert "AccessDenied" in findings["s3"]["detail"]
    assert "s3" not in summary["failures"]
    assert rc != 4, err


def test_listing_at_a_path_says_no_bucket_none(home: Path) -> None:
    with s3_stub(404, NO_BUCKET) as (port, _):
        rc, out, err = doctor(home, "--json", AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}/sub/path", **KEYS)
    findings, summary = events(out)
    assert findings["s3"]["status"] == "warn", findings["s3"]
    assert "None" not in findings["s3"]["detail"], findings["s3"]
    assert "s3" not in summary["failures"]
    assert rc != 3, err


@pytest.mark.parametrize("mode", [["--json"], ["-v"], []], ids=["json", "verbose", "table"])
def test_endpoint_url_secret_is_never_shown(home: Path, mode: list[str]) -> None:
    with s3_stub(200, BUCKETS) as (port, _):
        url = f"http://ak:SecretInUrl@127.0.0.1:{port}"
        rc, out, err = doctor(home, *mode, "--endpoint-url", url, **KEYS)
    assert "SecretInUrl" not in out + err, out + err
    assert rc == 2, err


def test_rq_nats_url_beats_the_config_file(home: Path, tmp_path: Path) -> None:
    conf = tmp_path / "rq.toml"
    conf.write_text('[doctor]\nnats-url = "nats://127.0.0.1:21898"\n')
    _rc, out, _err = doctor(home, "--json", RQ_CONFIG=str(conf), RQ_NATS_URL="nats://127.0.0.1:21897", **KEYS)
    findings, _ = events(out)
    nats = findings["nats"]
    assert "21897" in nats["detail"], nats
    assert nats["status"] == "warn", nats  # a shared default: warns, as docs/cli.md says


def test_ignore_configured_endpoint_urls_drops_aws_endpoint_url(home: Path) -> None:
    # (nothing listens on 21806: the variable must not be used at all)
    _rc, out, _err = doctor(
        home,
        "--json",
        AWS_ENDPOINT_URL="http://127.0.0.1:21806",
        AWS_IGNORE_CONFIGURED_ENDPOINT_URLS="true",
        **KEYS,
    )
    findings, _ = events(out)
    assert "21806" not in findings["s3"]["detail"], findings["s3"]
    assert findings["s3"]["detail"].startswith("AWS default endpoint"), findings["s3"]
