"""rq resolves AWS settings as boto3 / the aws CLI do (cache.s3.resolve_credentials).

Keys in the environment beat a profile named by AWS_PROFILE (only an explicit --profile flag, or
S3Settings(profile=…), disables them: botocore's create_credential_resolver); the active profile
still gives region, endpoint_url (or its `services` section) and ca_bundle;
AWS_IGNORE_CONFIGURED_ENDPOINT_URLS drops configured endpoints but not an explicit one."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from rqtest import Services, run_rq

from cache.errors import AuthError, BadSourceError
from cache.s3 import S3Settings, resolve_credentials


def aws_variables() -> list[str]:
    """The variables that steer boto3 here (none of this process's may reach rq)."""
    return [name for name in os.environ if name.startswith("AWS_") or name == "REQUESTS_CA_BUNDLE"]


def aws_home(tmp_path: Path, config: str = "", credentials: str = "") -> dict[str, str]:
    """A HOME with its own ~/.aws files; the variables that name them."""
    home = tmp_path / "home"
    (home / ".aws").mkdir(parents=True)
    (home / ".aws" / "config").write_text(config)
    (home / ".aws" / "credentials").write_text(credentials)
    return {
        "HOME": str(home),
        "AWS_CONFIG_FILE": str(home / ".aws" / "config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(home / ".aws" / "credentials"),
    }


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in aws_variables():
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def set_env(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def preload_env(services: Services, tmp_path: Path, **files: str) -> dict[str, str]:
    env = aws_home(tmp_path, **files)
    env |= {
        "AWS_ACCESS_KEY_ID": services.access_key,
        "AWS_SECRET_ACCESS_KEY": services.secret_key,
        "RQ_CACHE_DIR": str(tmp_path / "cache"),
    }
    return env


def dry_run(bucket: str, env: dict[str, str], *flags: str) -> tuple[int, dict[str, Any], str]:
    res = run_rq("preload", f"s3://{bucket}/d/", "--dry-run", "--json", *flags, env=env, timeout=60)
    summary = json.loads(res.stdout.decode().strip().splitlines()[-1])
    return res.returncode, summary, res.stderr.decode()


BAD_PROFILE = "[bad]\naws_access_key_id = {key}\naws_secret_access_key = wrong-secret\n"


@pytest.mark.integration
def test_env_keys_beat_a_profile_named_by_aws_profile(
    services: Services, bucket: str, s3_client: Any, tmp_path: Path
) -> None:
    s3_client.put_object(Bucket=bucket, Key="d/a", Body=b"x")
    env = preload_env(services, tmp_path, credentials=BAD_PROFILE.format(key=services.access_key))
    env |= {"AWS_ENDPOINT_URL": services.s3_endpoint, "AWS_PROFILE": "bad"}
    rc, summary, err = dry_run(bucket, env)
    assert rc == 0 and summary["objects"] == 1, err  # old: exit 4 SignatureDoesNotMatch
    # the --profile flag is an explicit choice: it does override the keys (botocore, aws --profile)
    rc, summary, err = dry_run(bucket, env, "--profile", "bad")
    assert rc == 4 and "SignatureDoesNotMatch" in summary["error"], err


@pytest.mark.integration
def test_region_only_profile_with_env_keys(
    services: Services, bucket: str, s3_client: Any, tmp_path: Path
) -> None:
    s3_client.put_object(Bucket=bucket, Key="d/a", Body=b"x")
    env = preload_env(services, tmp_path, config="[profile r]\nregion = us-east-1\n")
    env |= {"AWS_ENDPOINT_URL": services.s3_endpoint, "AWS_PROFILE": "r"}
    rc, summary, err = dry_run(bucket, env)
    assert rc == 0 and summary["objects"] == 1, err  # old: exit 4 "no AWS credentials found"


@pytest.mark.integration
def test_config_endpoint_with_env_keys(
    services: Services, bucket: str, s3_client: Any, tmp_path: Path
) -> None:
    """[default] endpoint_url, and a profile's `services` section, reach the store (old: AWS)."""
    s3_client.put_object(Bucket=bucket, Key="d/a", Body=b"x")
    config = (
        f"[default]\nendpoint_url = {services.s3_endpoint}\n"
        f"[profile svc]\nservices = local\n[services local]\ns3 =\n  endpoint_url = {services.s3_endpoint}\n"
    )
    env = preload_env(services, tmp_path, config=config)
    rc, summary, err = dry_run(bucket, env)
    assert rc == 0 and summary["objects"] == 1, err
    rc, summary, err = dry_run(bucket, env | {"AWS_PROFILE": "svc"})
    assert rc == 0 and summary["objects"] == 1, err


def test_settings_from_the_active_profile_with_env_keys(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = (
        "[default]\nregion = eu-west-1\nendpoint_url = http://127.0.0.1:21590\n"
        "[profile p]\nregion = ap-south-1\nca_bundle = /etc/p-ca.pem\nservices = mine\n"
        "[services mine]\ns3 =\n  endpoint_url = http://127.0.0.1:21591\n"
    )
    set_env(
        clean_env,
        aws_home(tmp_path, config=config) | {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"},
    )
    creds = resolve_credentials(S3Settings())
    assert (creds.region, creds.endpoint_url, creds.access_key) == (
        "eu-west-1",
        "http://127.0.0.1:21590",
        "k",
    )
    clean_env.setenv("AWS_PROFILE", "p")
    creds = resolve_credentials(S3Settings())
    assert (creds.region, creds.endpoint_url, creds.ca_bundle) == (
        "ap-south-1",
        "http://127.0.0.1:21591",
        "/etc/p-ca.pem",  # old: the ca_bundle lookup read AWS_DEFAULT_PROFILE only
    )
    # the environment beats the file; AWS_REGION beats AWS_DEFAULT_REGION
    set_env(clean_env, {"AWS_ENDPOINT_URL": "http://127.0.0.1:21592", "AWS_DEFAULT_REGION": "us-west-1"})
    creds = resolve_credentials(S3Settings())
    assert (creds.region, creds.endpoint_url) == ("us-west-1", "http://127.0.0.1:21592")
    clean_env.setenv("AWS_REGION", "us-west-2")
    assert resolve_credentials(S3Settings()).region == "us-west-2"
    # AWS_IGNORE_CONFIGURED_ENDPOINT_URLS: the variables and the file are dropped, a flag is not
    clean_env.setenv("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "true")
    assert resolve_credentials(S3Settings()).endpoint_url is None
    flag = S3Settings(endpoint_url="http://127.0.0.1:21593")
    assert resolve_credentials(flag).endpoint_url == "http://127.0.0.1:21593"


def test_profile_settings_without_env_keys(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The botocore path: same rules (services section, ignore flag in the profile)."""
    config = (
        "[profile p]\nregion = ap-south-1\nservices = mine\n"
        "[services mine]\ns3 =\n  endpoint_url = http://127.0.0.1:21594\n"
        "[profile q]\nendpoint_url = http://127.0.0.1:21595\nignore_configured_endpoint_urls = true\n"
    )
    credentials = "[p]\naws_access_key_id = pk\naws_secret_access_key = ps\n[q]\naws_access_key_id = qk\naws_secret_access_key = qs\n"
    set_env(clean_env, aws_home(tmp_path, config=config, credentials=credentials))
    creds = resolve_credentials(S3Settings(profile="p"))
    assert (creds.access_key, creds.region, creds.endpoint_url) == (
        "pk",
        "ap-south-1",
        "http://127.0.0.1:21594",
    )
    creds = resolve_credentials(S3Settings(profile="q"))
    assert (creds.access_key, creds.endpoint_url) == ("qk", None)


def test_missing_profile_and_services_section(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    set_env(clean_env, aws_home(tmp_path, config="[profile s]\nservices = nowhere\n"))
    set_env(clean_env, {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_PROFILE": "nope"})
    with pytest.raises(AuthError, match=r"profile not found.*\(nope\)"):
        resolve_credentials(S3Settings())
    clean_env.setenv("AWS_PROFILE", "s")
    with pytest.raises(AuthError, match="services section"):
        resolve_credentials(S3Settings())


def test_userinfo_in_endpoint_is_refused_unechoed(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    set_env(clean_env, aws_home(tmp_path) | {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"})
    for url in ("http://ak:SecretInUrl@127.0.0.1:21596", "http://ak:Secret/In@Url@127.0.0.1:21596/x"):
        with pytest.raises(BadSourceError, match="user info") as info:
            resolve_credentials(S3Settings(endpoint_url=url))
        assert "Secret" not in str(info.value) and "127.0.0.1:21596" in str(info.value)


def test_a_bad_endpoint_without_env_keys_is_a_bad_url_not_credentials(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The botocore path caught ValueError for a credential_process's bad output, and
    BadSourceError is a ValueError: AWS_ENDPOINT_URL=garbage was 'credential_process output invalid'."""
    credentials = "[default]\naws_access_key_id = dk\naws_secret_access_key = ds\n"
    set_env(clean_env, aws_home(tmp_path, credentials=credentials) | {"AWS_ENDPOINT_URL": "garbage"})
    with pytest.raises(BadSourceError, match="endpoint URL must be"):
        resolve_credentials(S3Settings())


def test_the_active_profile_is_the_one_named_whatever_the_credentials_file_holds(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The credentials file's sections were merged in a loop that reused the active profile's
    variable: with two or more profiles there, the last one's region and endpoint were used."""
    config = (
        "[default]\nregion = eu-west-1\nendpoint_url = http://127.0.0.1:21597\n"
        "[profile other]\nregion = ap-south-1\nendpoint_url = http://127.0.0.1:21598\n"
    )
    credentials = "[default]\naws_access_key_id = x\naws_secret_access_key = y\n[other]\naws_access_key_id = x2\naws_secret_access_key = y2\n"
    set_env(clean_env, aws_home(tmp_path, config=config, credentials=credentials))
    set_env(clean_env, {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"})
    creds = resolve_credentials(S3Settings())
    assert (creds.region, creds.endpoint_url) == ("eu-west-1", "http://127.0.0.1:21597")
    clean_env.setenv("AWS_PROFILE", "tpyo")  # a mistyped profile is refused, not swapped for another
    with pytest.raises(AuthError, match=r"profile not found.*\(tpyo\)"):
        resolve_credentials(S3Settings())


def test_a_default_profile_named_in_the_environment_must_exist(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    set_env(clean_env, aws_home(tmp_path, config="[profile p]\nregion = eu-west-1\n"))
    set_env(clean_env, {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"})
    assert resolve_credentials(S3Settings()).region == "us-east-1"  # not named: none is fine
    clean_env.setenv("AWS_PROFILE", "default")
    with pytest.raises(AuthError, match=r"profile not found.*\(default\)"):
        resolve_credentials(S3Settings())
