"""Credentials that expire (AssumeRole, IRSA, SSO, an instance role, credential_process) were
frozen once per process: botocore's refreshable object was read once and the CRT signed with a
static copy for the process's life, so a training job outliving its role session failed every miss
and revalidation with AuthError, even from a new Cache (API review). Now they are asked again for
every signature, and botocore refreshes them as boto3 would. Real SeaweedFS; a credential_process
that hands out a wrong secret until the rotation has happened (a file says so) and the right one
after, each valid for 5 minutes (inside botocore's 10-minute mandatory refresh, so every signature
asks again)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from cache import AuthError, Cache

PROCESS = """#!/bin/sh
n=$(cat {count} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {count}
if [ -e {rotated} ]; then s={secret}; else s=not-the-secret; fi
exp=$(date -u -d '+300 seconds' +%Y-%m-%dT%H:%M:%SZ)
printf '{{"Version":1,"AccessKeyId":"{key}","SecretAccessKey":"%s","Expiration":"%s"}}\\n' $s $exp
"""


@pytest.fixture
def expiring_profile(tmp_path: Path, services: Any, monkeypatch: pytest.MonkeyPatch) -> Path:
    count = tmp_path / "calls"
    script = tmp_path / "credproc.sh"
    rotated = tmp_path / "rotated"
    script.write_text(
        PROCESS.format(count=count, rotated=rotated, secret=services.secret_key, key=services.access_key)
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    config = tmp_path / "config"
    config.write_text(f"[profile expiring]\ncredential_process = {script}\n")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    return count


def test_credentials_that_expire_are_fetched_again(
    expiring_profile: Path, services: Any, s3_client: Any, bucket: str, tmp_path: Path
) -> None:
    for i in range(2):
        s3_client.put_object(Bucket=bucket, Key=f"k{i}", Body=b"sample %d" % i)
    with Cache(tmp_path / "c", endpoint_url=services.s3_endpoint, profile="expiring") as c:
        with pytest.raises(AuthError):
            c.read_bytes(f"s3://{bucket}/k0")  # signed with the old, wrong secret
        calls = int(expiring_profile.read_text())
        (expiring_profile.parent / "rotated").touch()  # the role session was renewed
        # old: the same frozen copy signed again, AuthError for the life of the process
        assert c.read_bytes(f"s3://{bucket}/k1") == b"sample 1"
    assert int(expiring_profile.read_text()) > calls
