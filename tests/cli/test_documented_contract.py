"""What docs/cli.md and docs/cache.md promise about sizes, environment variables and endpoints,
checked through the real `rq` (the findings of a docs-against-behaviour review)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rqtest import run_rq

from cache.errors import BadSourceError
from cache.sizes import parse_size


def _last_json(stdout: bytes) -> dict[str, Any]:
    line = stdout.decode().strip().splitlines()[-1]
    parsed: dict[str, Any] = json.loads(line)
    return parsed


@pytest.mark.parametrize("text", ["0.5", "1.5", "0.3"])
def test_a_plain_number_of_bytes_must_be_whole(text: str) -> None:
    with pytest.raises(BadSourceError, match="whole number of bytes"):
        parse_size(text)


@pytest.mark.parametrize(("text", "size"), [("1.5K", 1536), ("1.5GiB", 3 << 29), ("1.0", 1), ("64", 64)])
def test_a_fraction_with_a_unit_is_whole_bytes(text: str, size: int) -> None:
    assert parse_size(text) == size


def test_a_fractional_ram_limit_is_refused_not_taken_as_zero(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(b"x" * 100)
    cache_dir = tmp_path / "cache"
    done = run_rq("preload", str(src), "--tier", "ram", "--cache-dir", str(cache_dir), "--ram-limit", "0.5")
    assert done.returncode == 2, done.stderr.decode()
    assert b"whole number of bytes" in done.stderr
    assert not cache_dir.exists()  # refused while parsing: no cap of 0 remembered


def test_rq_command_option_variables_work_for_every_command(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(b"x" * 100)
    env = {"RQ_CACHE_DIR": str(tmp_path / "cache")}
    done = run_rq("preload", str(src), env={**env, "RQ_PRELOAD_JSON": "1"})
    assert done.returncode == 0, done.stderr.decode()
    assert _last_json(done.stdout)["objects"] == 1
    du = run_rq("cache", "du", env={**env, "RQ_CACHE_DU_JSON": "1"})
    assert du.returncode == 0, du.stderr.decode()
    assert _last_json(du.stdout)["disk"]["objects"] == 1


@pytest.mark.integration
def test_the_s3_specific_endpoint_variable_wins(
    tmp_path: Path, aws_env: dict[str, str], bucket: str, s3_client: Any
) -> None:
    s3_client.put_object(Bucket=bucket, Key="p/a.bin", Body=b"y" * 10)
    endpoint = aws_env["AWS_ENDPOINT_URL"]
    env = {
        **aws_env,
        "AWS_ENDPOINT_URL_S3": endpoint,
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",  # nothing listens there (discard)
        "RQ_CACHE_DIR": str(tmp_path / "cache"),
    }
    done = run_rq("preload", f"s3://{bucket}/p/", "--json", env=env, timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    assert _last_json(done.stdout)["objects"] == 1
    url = f"s3://{bucket}/p/a.bin"
    cached = Path(run_rq("cache", "path", url, "--no-check", env=env).stdout.decode().strip())
    cached.unlink()  # gone: `rq cache path` fetches it again from the endpoint
    path = run_rq("cache", "path", url, env=env, timeout=60)
    assert path.returncode == 0, path.stderr.decode()
    assert Path(path.stdout.decode().strip()).read_bytes() == b"y" * 10


def test_doctor_warns_about_an_unreachable_rq_nats_url_from_the_environment(tmp_path: Path) -> None:
    done = run_rq("doctor", "--json", env={"RQ_NATS_URL": "nats://127.0.0.1:9"}, timeout=60)
    findings = [json.loads(x) for x in done.stdout.decode().splitlines() if '"finding"' in x]
    nats = next(f for f in findings if f["check"] == "nats")
    assert nats["status"] == "warn", nats  # set, so checked; not asked for, so no failure
    assert done.returncode == 0, done.stderr.decode()


def test_doctor_table_in_a_ci_log_keeps_whole_paths(tmp_path: Path) -> None:
    deep = tmp_path / ("a-long-directory-name-" * 4) / "cache"
    done = run_rq("doctor", "--cache-dir", str(deep), timeout=60)  # stdout is a pipe: no terminal
    assert "…" not in done.stdout.decode()
    assert str(deep).replace("/", "") in "".join(c for c in done.stdout.decode() if c not in "│ \n/")


def test_preload_into_a_directory_that_is_no_cache_ends_json_with_its_summary(tmp_path: Path) -> None:
    src, not_a_cache = tmp_path / "src", tmp_path / "mine"
    src.mkdir()
    not_a_cache.mkdir()
    (src / "a.bin").write_bytes(b"x")
    (not_a_cache / "notes.txt").write_text("mine")
    done = run_rq("preload", str(src), "--cache-dir", str(not_a_cache), "--json")
    assert done.returncode == 2, done.stderr.decode()
    last = _last_json(done.stdout)
    assert last["event"] == "summary" and last["aborted"] is True and "not an rq cache" in last["error"]
    assert sorted(p.name for p in not_a_cache.iterdir()) == ["notes.txt"]


def test_a_top_level_key_in_the_config_file_is_refused_not_ignored(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("json = true\n")
    done = run_rq("--config", str(config), "cache", "du", "--cache-dir", str(tmp_path / "c"))
    assert done.returncode == 2
    assert "top-level 'json' is not read" in done.stderr.decode()
    config.write_text("[prelod]\nworkers = 4\n")
    done = run_rq("--config", str(config), "cache", "du", "--cache-dir", str(tmp_path / "c"))
    assert done.returncode == 2 and "did you mean 'preload'" in done.stderr.decode()
