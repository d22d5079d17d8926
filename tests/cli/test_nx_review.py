"""A new user's review of rq doctor and rq cache (nx): where a refused value came from, what a
refused URL quotes, cat and a JSON setting, a declined clear, prefix URLs, -q doctor, NATS ports."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rqtest import home_config, home_env, rq_command, run_rq

from rqcli.exitcodes import ExitCode

USERINFO = "http://ak:SecretInUrl@127.0.0.1:18333"


def _line(res: subprocess.CompletedProcess[bytes]) -> str:
    err: str = res.stderr.decode()
    assert err.count("\n") == 1, err
    return err


def test_a_typed_endpoint_with_user_info_names_no_variable_and_shows_the_cut(tmp_path: Path) -> None:
    env = home_env(tmp_path, AWS_ENDPOINT_URL="http://127.0.0.1:18333")
    for args in (("doctor",), ("preload", "s3://b/x/", "--cache-dir", str(tmp_path / "c"))):
        res = run_rq(*args, "--endpoint-url", USERINFO, env=env)
        assert res.returncode == ExitCode.USAGE, res.stderr
        line = _line(res)
        assert "'http://***@127.0.0.1:18333'" in line and "(from" not in line, line
        assert "Secret" not in line


def test_an_endpoint_with_user_info_from_the_environment_or_file_names_it(tmp_path: Path) -> None:
    env = home_env(tmp_path, AWS_ENDPOINT_URL=USERINFO)
    res = run_rq("preload", "s3://b/x/", "--cache-dir", str(tmp_path / "c"), env=env)
    assert res.returncode == ExitCode.USAGE
    assert "'http://***@127.0.0.1:18333' (from AWS_ENDPOINT_URL)" in _line(res)
    path = home_config(tmp_path, f'[doctor]\nendpoint-url = "{USERINFO}"\n')
    res = run_rq("doctor", env=home_env(tmp_path, AWS_ENDPOINT_URL="http://127.0.0.1:18333"))
    assert res.returncode == ExitCode.USAGE
    line = _line(res)
    assert f"config file {path}: [doctor] endpoint-url:" in line and "***@" in line, line


@pytest.fixture
def cached_file(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """A local file and the environment of an rq whose cache (RAM tier private) is under tmp_path."""
    from cache import Cache

    ram = Path("/dev/shm") / f"rqtest-{uuid.uuid4().hex[:10]}"
    Cache(tmp_path / "c", ram_dir=ram).close()
    f = tmp_path / "obj.txt"
    f.write_bytes(b"hello\n")
    yield f, home_env(tmp_path, RQ_CACHE_DIR=str(tmp_path / "c"))
    shutil.rmtree(ram, ignore_errors=True)


def test_cat_refuses_its_own_json_setting_naming_it_and_ignores_a_group_wide_one(
    tmp_path: Path, cached_file: tuple[Path, dict[str, str]]
) -> None:
    f, env = cached_file
    res = run_rq("cache", "cat", str(f), env={**env, "RQ_CACHE_CAT_JSON": "1"})
    assert res.returncode == ExitCode.USAGE and "RQ_CACHE_CAT_JSON" in _line(res), res.stderr
    path = home_config(tmp_path, "[cache.cat]\njson = true\n")
    res = run_rq("cache", "cat", str(f), env=env)
    assert res.returncode == ExitCode.USAGE and f"config file {path}: [cache.cat] json" in _line(res)
    home_config(tmp_path, "[cache]\njson = true\n")
    for extra in ({}, {"RQ_CACHE_JSON": "1"}, {"RQ_JSON": "1"}):
        res = run_rq("cache", "cat", str(f), env={**env, **extra})
        assert res.returncode == 0 and res.stdout == b"hello\n", (extra, res.stderr)
    for args in (("--json", "cache", "cat", str(f)), ("cache", "cat", str(f), "--json")):
        res = run_rq(*args, env=env)
        assert res.returncode == ExitCode.USAGE and "drop --json" in _line(res)


def test_declining_clear_at_the_terminal_is_exit_0(cached_file: tuple[Path, dict[str, str]]) -> None:
    f, env = cached_file
    assert run_rq("cache", "cat", str(f), env=env).returncode == 0
    leader, follower = os.openpty()
    try:
        os.write(leader, b"n\n")
        proc = subprocess.run(
            [*rq_command(), "cache", "clear"],
            stdin=follower,
            capture_output=True,
            env={**os.environ, "CI": "1", **env},
            timeout=60,
            check=False,
        )
    finally:
        os.close(follower)
        os.close(leader)
    assert proc.returncode == 0 and b"not cleared" in proc.stdout, proc.stderr
    assert str(f).encode() in run_rq("cache", "ls", env=env).stdout  # still cached


@pytest.mark.parametrize("command", ["cat", "path", "stat"])
def test_a_prefix_or_bucket_is_a_usage_error_for_each_one_object_command(
    command: str, cached_file: tuple[Path, dict[str, str]]
) -> None:
    _f, env = cached_file
    for url in ("s3://b/train/", "s3://b"):
        res = run_rq("cache", command, url, env=env)
        assert res.returncode == ExitCode.USAGE, (url, res.stderr)
        assert "not one object" in _line(res) or "names a bucket" in res.stderr.decode()


def test_cat_of_a_prefix_without_its_slash_says_objects_are_under_it(
    cached_file: tuple[Path, dict[str, str]], aws_env: dict[str, str], s3_client: Any, bucket: str
) -> None:
    s3_client.put_object(Bucket=bucket, Key="train/a.txt", Body=b"a")
    env = {**cached_file[1], **aws_env}
    res = run_rq("cache", "cat", f"s3://{bucket}/train", env=env)
    assert res.returncode == ExitCode.NOT_FOUND
    assert f"objects are under s3://{bucket}/train/" in _line(res)
    res = run_rq("cache", "cat", f"s3://{bucket}/nothing", env=env)
    assert res.returncode == ExitCode.NOT_FOUND and "objects are under" not in _line(res)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_quiet_doctor_prints_the_rows_that_need_doing(tmp_path: Path) -> None:
    env = home_env(tmp_path, RQ_CACHE_DIR=str(tmp_path / "c"))
    res = run_rq("-q", "doctor", "--nats-url", f"nats://127.0.0.1:{_closed_port()}", env=env)
    assert res.returncode == ExitCode.UNREACHABLE, res.stderr
    rows = res.stdout.decode().splitlines()
    assert rows[0].split("\t") == ["check", "status", "finding", "what to do"], rows
    assert any(r.startswith("nats\tfail\t") for r in rows), rows
    assert all(r.split("\t")[1] in ("warn", "fail") for r in rows[1:]), rows


@pytest.mark.parametrize("port", ["0", "99999"])
def test_a_nats_url_with_a_bad_port_is_said_as_such(port: str, tmp_path: Path) -> None:
    res = run_rq("doctor", "--nats-url", f"nats://127.0.0.1:{port}", env=home_env(tmp_path))
    assert res.returncode == ExitCode.USAGE
    line = _line(res)
    assert f"NATS URL 'nats://127.0.0.1:{port}': its port must be a number from 1 to 65535" in line
    assert "is not a nats:// URL" not in line
