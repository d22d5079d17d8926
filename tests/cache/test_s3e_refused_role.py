"""A profile whose role cannot be assumed (role_arn + source_profile; STS answers AccessDenied):
rq says so in one line naming the profile and the role, exit 4 (it was 'unexpected ClientError',
exit 1), and rq doctor shows an s3 finding and runs its other checks (it aborted with no table).
Settings botocore reads that rq took no notice of: AWS_MAX_ATTEMPTS / max_attempts (honoured:
the retries of a request; an invalid value is one line, exit 2), retry_mode (checked)."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rqtest import http_on_loopback, run_rq

from cache.errors import AuthError, BadSourceError
from cache.s3 import S3, S3Settings, resolve_credentials

DENIED = (
    b'<ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><Error><Type>Sender</Type>'
    b"<Code>AccessDenied</Code><Message>User: arn:aws:iam::123456789012:user/src is not authorized "
    b"to perform: sts:AssumeRole</Message></Error><RequestId>r1</RequestId></ErrorResponse>"
)
ROLE = "arn:aws:iam::123456789012:role/rq-s3e-nope"


@contextlib.contextmanager
def sts_refusing() -> Iterator[int]:
    """An 'STS' on a free 127.0.0.1 port that refuses every AssumeRole."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(403)
            self.send_header("Content-Type", "text/xml")
            self.send_header("Content-Length", str(len(DENIED)))
            self.end_headers()
            self.wfile.write(DENIED)

        def log_message(self, *args: Any) -> None:
            pass

    with http_on_loopback(Handler) as port:
        yield port


def role_env(tmp_path: Path, port: int) -> dict[str, str]:
    """Variables for a process that reads the profile `r` (a role of source profile `src`)."""
    (tmp_path / "config").write_text(
        f"[profile r]\nrole_arn = {ROLE}\nsource_profile = src\nregion = us-east-1\n"
        "[profile src]\nregion = us-east-1\n"
    )
    (tmp_path / "credentials").write_text("[src]\naws_access_key_id = AKIDSRC\naws_secret_access_key = s\n")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "RQ_"))}
    base.pop("REQUESTS_CA_BUNDLE", None)
    return {
        **base,
        "HOME": str(tmp_path),
        "AWS_CONFIG_FILE": str(tmp_path / "config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "credentials"),
        "AWS_ENDPOINT_URL_STS": f"http://127.0.0.1:{port}",
        "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:24799",
        "AWS_MAX_ATTEMPTS": "1",  # (botocore's STS client: no retries of the refusal)
        "RQ_CONFIG": "/dev/null",
        "RQ_CACHE_DIR": str(tmp_path / "cache"),
    }


def test_a_refused_role_is_an_auth_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with sts_refusing() as port:
        for name in list(os.environ):
            if name.startswith("AWS_"):
                monkeypatch.delenv(name)
        for name, value in role_env(tmp_path, port).items():
            monkeypatch.setenv(name, value)
        with pytest.raises(AuthError) as caught:
            resolve_credentials(S3Settings(profile="r"))
    said = str(caught.value)
    assert "'r'" in said and ROLE in said and "AccessDenied" in said and "\n" not in said


def test_rq_preload_exits_4_naming_the_role(tmp_path: Path) -> None:
    with sts_refusing() as port:
        proc = run_rq("preload", "s3://bkt/p/", "--profile", "r", env=role_env(tmp_path, port), timeout=60)
    err = proc.stderr.decode()
    assert proc.returncode == 4, err
    assert ROLE in err and "AccessDenied" in err
    assert "unexpected" not in err.lower() and "Traceback" not in err


def test_rq_doctor_shows_the_s3_finding_and_runs_the_rest(tmp_path: Path) -> None:
    with sts_refusing() as port:
        env = {**role_env(tmp_path, port), "AWS_PROFILE": "r"}
        proc = run_rq("doctor", "--json", env=env, timeout=60)
    err = proc.stderr.decode()
    assert "unexpected" not in err.lower() and "Traceback" not in err, err
    lines = [json.loads(line) for line in proc.stdout.decode().splitlines() if line.strip()]
    findings = {e["check"]: e for e in lines if e.get("event") == "finding"}
    assert findings["s3"]["status"] in ("warn", "fail")
    assert ROLE in findings["s3"]["detail"]
    assert len(findings) > 1  # the other checks ran
    assert any(e.get("event") == "summary" for e in lines)


def keys_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, **env: str) -> None:
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "a")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "b")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:24799")
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def test_max_attempts_sets_the_retries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """botocore's max_attempts counts the first attempt: 3 is 2 retries (the CRT's and the
    ranged GETs'); 1 is none. An explicit S3Settings.max_retries still wins; unset: 6."""
    keys_env(monkeypatch, tmp_path, AWS_MAX_ATTEMPTS="3")
    assert S3(S3Settings()).settings.max_retries == 2
    assert S3(S3Settings(max_retries=4)).settings.max_retries == 4
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    assert S3(S3Settings()).settings.max_retries == 0
    monkeypatch.delenv("AWS_MAX_ATTEMPTS")
    assert S3(S3Settings()).settings.max_retries == 6
    (tmp_path / "config").write_text("[default]\nmax_attempts = 5\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    assert S3(S3Settings()).settings.max_retries == 4


@pytest.mark.parametrize(
    ("variable", "value"),
    [("AWS_MAX_ATTEMPTS", "abc"), ("AWS_MAX_ATTEMPTS", "0"), ("AWS_RETRY_MODE", "fast")],
)
def test_an_invalid_retry_setting_is_one_line_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    keys_env(monkeypatch, tmp_path, **{variable: value})
    with pytest.raises(BadSourceError) as caught:
        resolve_credentials(S3Settings())
    assert variable in str(caught.value) and value in str(caught.value)
    env = {**os.environ, "RQ_CACHE_DIR": str(tmp_path / "cache")}
    proc = run_rq("preload", "s3://bkt/p/", env=env, timeout=60)
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert variable in err and len(err.strip().splitlines()) <= 2
    assert err.count(f"(from {variable})") == 1, err  # dr6: rqcli.main named it a second time


def test_rq_doctor_names_an_invalid_setting_not_the_endpoint(tmp_path: Path) -> None:
    env = {**role_env(tmp_path, 24799), "AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"}
    env |= {"AWS_MAX_ATTEMPTS": "abc", "AWS_ENDPOINT_URL": "http://127.0.0.1:24799"}
    proc = run_rq("doctor", "--json", env=env, timeout=60)
    lines = [json.loads(line) for line in proc.stdout.decode().splitlines() if line.strip()]
    s3 = next(e for e in lines if e.get("event") == "finding" and e["check"] == "s3")
    assert "AWS_MAX_ATTEMPTS" in s3["detail"] and "from AWS_ENDPOINT_URL" not in s3["detail"]
