"""S3 over HTTPS behind a private certificate authority: AWS_CA_BUNDLE is trusted on every path.

A TLS front (the fault proxy with an SSL context, certificate for localhost signed by a CA made
here) relays to the real SeaweedFS. boto3 and s5cmd trust the CA named by AWS_CA_BUNDLE; so must
the CRT (listing, small objects) and the ranged path (big objects' pieces)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from cachekit import payload, seed_objects, summary
from rqtest import run_rq
from test_ranged import SIZE, Collector
from tlskit import PrivateCA, make_private_ca

from cache.errors import TlsError
from cache.s3 import S3, S3Settings

pytestmark = pytest.mark.integration


@pytest.fixture
def private_ca(tmp_path: Path) -> PrivateCA:
    return make_private_ca(tmp_path / "pki")


def test_preload_over_https_trusts_the_ca_named_by_aws_ca_bundle(
    s3_client: Any, bucket: str, cache_env: dict[str, str], proxy_factory: Any, private_ca: PrivateCA
) -> None:
    data = seed_objects(s3_client, bucket, "t/", 12, 40 * 1024)
    front = proxy_factory(tls=private_ca.context)
    env = {**cache_env, "AWS_CA_BUNDLE": str(private_ca.ca_file)}
    proc = run_rq(
        "preload", f"s3://{bucket}/t/", "--json", "--endpoint-url", front.endpoint, env=env, timeout=60
    )
    assert proc.returncode == 0, proc.stderr.decode()
    s = summary(proc)
    assert s["objects"] == len(data) and s["failed"] == 0
    assert front.stats.forwarded >= len(data) + 1  # the listing and every object went through TLS
    from cache import Cache

    with Cache(Path(cache_env["RQ_CACHE_DIR"])) as c:
        for key, body in data.items():
            assert c.read_bytes(f"s3://{bucket}/{key}") == body


def test_an_untrusted_certificate_is_one_clear_line_and_nothing_lands(
    s3_client: Any,
    bucket: str,
    cache_env: dict[str, str],
    proxy_factory: Any,
    private_ca: PrivateCA,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seed_objects(s3_client, bucket, "t/", 3, 1024)
    front = proxy_factory(tls=private_ca.context)
    monkeypatch.delenv("AWS_CA_BUNDLE", raising=False)  # (run_rq passes this process's environment on)
    env = {k: v for k, v in cache_env.items() if k != "AWS_CA_BUNDLE"}
    # (without the probe the CRT said nothing for minutes, s2n holding each failed handshake
    # 10-30 s: run_rq's timeout then fails the test)
    proc = run_rq("preload", f"s3://{bucket}/t/", "--endpoint-url", front.endpoint, env=env, timeout=60)
    lines = proc.stderr.decode().strip().splitlines()
    assert proc.returncode == 4, lines
    assert len(lines) == 1 and "certificate" in lines[0] and "AWS_CA_BUNDLE" in lines[0], lines
    assert front.stats.forwarded == 0
    listing = run_rq("cache", "ls", "--json", env=cache_env)
    assert listing.returncode == 0 and listing.stdout.strip() == b"", listing.stdout


def test_ranged_pieces_over_https_trust_the_same_bundle(
    s3_client: Any,
    bucket: str,
    proxy_factory: Any,
    private_ca: PrivateCA,
    aws_env: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    body = payload(3, SIZE)
    s3_client.put_object(Bucket=bucket, Key="r/obj.bin", Body=body)
    front = proxy_factory(tls=private_ca.context)
    monkeypatch.setenv("AWS_CA_BUNDLE", str(private_ca.ca_file))
    got = Collector(SIZE)
    S3(S3Settings(endpoint_url=front.endpoint)).ranged.start(
        bucket, "r/obj.bin", (0, SIZE - 1), None, got.sink, got.on_done
    )
    got.wait()
    assert got.error is None, got.error
    assert bytes(got.data) == body


def test_a_profiles_ca_bundle_is_trusted_as_botocore_trusts_it(
    s3_client: Any,
    bucket: str,
    cache_env: dict[str, str],
    proxy_factory: Any,
    private_ca: PrivateCA,
    services: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = seed_objects(s3_client, bucket, "t/", 4, 8 * 1024)
    front = proxy_factory(tls=private_ca.context)
    config, credentials = tmp_path / "aws-config", tmp_path / "aws-credentials"
    config.write_text(f"[profile tlsprof]\nregion = us-east-1\nca_bundle = {private_ca.ca_file}\n")
    credentials.write_text(
        f"[tlsprof]\naws_access_key_id = {services.access_key}\n"
        f"aws_secret_access_key = {services.secret_key}\n"
    )
    drop = ("AWS_CA_BUNDLE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE")
    for name in drop:  # (run_rq passes this process's environment on)
        monkeypatch.delenv(name, raising=False)
    env = {k: v for k, v in cache_env.items() if k not in drop}
    env |= {"AWS_CONFIG_FILE": str(config), "AWS_SHARED_CREDENTIALS_FILE": str(credentials)}
    proc = run_rq(
        "preload",
        f"s3://{bucket}/t/",
        "--json",
        "--profile",
        "tlsprof",
        "--endpoint-url",
        front.endpoint,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert summary(proc)["objects"] == len(data)


@pytest.mark.parametrize("reply_over_tls", [False, True])
def test_the_probe_ends_waits_unless_a_reply_over_tls_overrules_it(
    proxy_factory: Any, private_ca: PrivateCA, monkeypatch: pytest.MonkeyPatch, reply_over_tls: bool
) -> None:
    import cache.tls

    monkeypatch.setattr(cache.tls, "GRACE_S", 0.5)
    front = proxy_factory(tls=private_ca.context)
    fired: list[Exception] = []
    early: list[Exception] = []
    # no bundle: the system's trust store, which does not hold the private CA
    check = cache.tls.TlsCheck("localhost", front.port, None, front.endpoint, 30.0)
    check.on_failure(early.append)  # waiting before the verdict
    if reply_over_tls:
        check.passed()  # the CRT's trust works after all (s2n and OpenSSL judged differently)
    deadline = time.monotonic() + 30
    while not check._done:
        assert time.monotonic() < deadline, "no verdict from the probe in 30 s"
        time.sleep(0.02)
    check.on_failure(fired.append)  # asking after the verdict
    if reply_over_tls:
        assert early == [] and fired == [] and check.failure() is None
    else:
        assert len(early) == 1 and isinstance(early[0], TlsError) and len(fired) == 1
        assert "not trusted" in str(early[0]) and str(fired[0]) == str(early[0])
        # each waiter, each call, gets its own exception: one raised again and again would pin
        # every caller's frames in its growing traceback
        assert fired[0] is not early[0] and check.failure() is not check.failure()


@pytest.mark.parametrize("content", [None, b"not a certificate\n"])
def test_a_ca_bundle_that_cannot_be_used_is_a_usage_error(
    cache_env: dict[str, str], tmp_path: Path, content: bytes | None
) -> None:
    bundle = tmp_path / "bundle.pem"
    if content is not None:
        bundle.write_bytes(content)
    env = {**cache_env, "AWS_CA_BUNDLE": str(bundle)}
    proc = run_rq("preload", "s3://b/p/", "--endpoint-url", "https://localhost:9", env=env, timeout=60)
    lines = proc.stderr.decode().strip().splitlines()
    assert proc.returncode == 2, lines
    assert len(lines) == 1 and str(bundle) in lines[0], lines
    assert ("No such file" if content is None else "no PEM certificate") in lines[0]


@pytest.mark.parametrize("case", ["untrusted", "trusted", "another-name"])
def test_doctor_names_an_untrusted_certificate_and_what_to_fix(
    proxy_factory: Any, private_ca: PrivateCA, aws_env: Any, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    front = proxy_factory(tls=private_ca.context)
    monkeypatch.delenv("AWS_CA_BUNDLE", raising=False)  # (run_rq passes this process's environment on)
    env = {} if case == "untrusted" else {"AWS_CA_BUNDLE": str(private_ca.ca_file)}
    # the certificate names localhost: by address it is the wrong name, with the right bundle
    endpoint = front.endpoint.replace("localhost", "127.0.0.1") if case == "another-name" else front.endpoint
    proc = run_rq("doctor", "--json", "--endpoint-url", endpoint, env=env, timeout=60)
    lines = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    s3 = next(o for o in lines if o["event"] == "finding" and o["check"] == "s3")
    if case == "trusted":
        assert s3["status"] == "ok", s3
        return
    assert proc.returncode == 4, proc.stderr.decode()
    assert s3["status"] == "fail" and "certificate" in s3["detail"], s3
    if case == "untrusted":
        assert "AWS_CA_BUNDLE" in s3["fix"], s3
    else:
        assert "host name" in s3["fix"] and "AWS_CA_BUNDLE" not in s3["fix"], s3


@pytest.mark.parametrize("where", ["default-profile", "requests-ca-bundle"])
def test_keys_from_the_environment_still_take_the_bundle_botocore_would(
    s3_client: Any,
    bucket: str,
    cache_env: dict[str, str],
    proxy_factory: Any,
    private_ca: PrivateCA,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    where: str,
) -> None:
    # the keys come from the environment, so rq does not load botocore: the default profile's
    # ca_bundle, then REQUESTS_CA_BUNDLE, are found as botocore finds them
    import boto3

    data = seed_objects(s3_client, bucket, "t/", 3, 4096)
    front = proxy_factory(tls=private_ca.context)
    for name in ("AWS_CA_BUNDLE", "REQUESTS_CA_BUNDLE", "AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(name, raising=False)  # (run_rq passes this process's environment on)
    config = tmp_path / "aws-config"
    config.write_text("[default]\nregion = us-east-1\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    if where == "default-profile":
        config.write_text(f"[default]\nregion = us-east-1\nca_bundle = {private_ca.ca_file}\n")
    else:
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(private_ca.ca_file))
    # the peer first: boto3 trusts the store this way (and so the test's setup is right)
    peer = boto3.session.Session().client("s3", endpoint_url=front.endpoint)  # reads the config now
    listed = peer.list_objects_v2(Bucket=bucket, Prefix="t/")
    assert listed["KeyCount"] == len(data)
    proc = run_rq(
        "preload", f"s3://{bucket}/t/", "--json", "--endpoint-url", front.endpoint, env=cache_env, timeout=60
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert summary(proc)["objects"] == len(data)


def test_a_certificate_for_another_name_says_to_use_that_name(
    s3_client: Any, bucket: str, cache_env: dict[str, str], proxy_factory: Any, private_ca: PrivateCA
) -> None:
    seed_objects(s3_client, bucket, "t/", 2, 1024)
    front = proxy_factory(tls=private_ca.context)
    by_address = front.endpoint.replace("localhost", "127.0.0.1")  # the certificate names localhost
    env = {**cache_env, "AWS_CA_BUNDLE": str(private_ca.ca_file)}
    proc = run_rq("preload", f"s3://{bucket}/t/", "--endpoint-url", by_address, env=env, timeout=60)
    lines = proc.stderr.decode().strip().splitlines()
    assert proc.returncode == 4, lines
    assert len(lines) == 1 and "mismatch" in lines[0] and "host name" in lines[0], lines
    assert "AWS_CA_BUNDLE" not in lines[0]  # the bundle is right: pointing at it would mislead


def test_a_fast_failure_never_crashes_the_exit(tmp_path: Path) -> None:
    """The TLS probe's daemon thread was still inside OpenSSL (loading the trust store) when a
    preload that failed fast exited: libcrypto's exit handler freed its locks under it, and the
    process died of SIGSEGV (exit 139) in about one run of five instead of exiting 6."""
    env = {
        "AWS_ACCESS_KEY_ID": "k",
        "AWS_SECRET_ACCESS_KEY": "s",
        "AWS_REGION": "us-east-1",
        "RQ_CACHE_DIR": str(tmp_path / "cache"),
    }
    codes = [
        run_rq("preload", "s3://b/x/", "-q", "--endpoint-url", "https://rq-test.invalid", env=env).returncode
        for _ in range(15)
    ]
    assert set(codes) == {6}, codes
