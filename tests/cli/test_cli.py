"""The `rq` shell: help, version, global options, config precedence, exit codes, doctor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rqtest import Services, run_rq

from rqcli.exitcodes import ExitCode


def test_help_lists_commands_with_examples() -> None:
    res = run_rq("--help")
    assert res.returncode == 0
    text = res.stdout.decode()
    assert "doctor" in text and "\n  rq doctor --endpoint-url" in text
    assert "Exit codes:" in text and "130" in text


def test_version_and_module_entry() -> None:
    res = run_rq("--version")
    assert res.returncode == 0
    assert res.stdout.decode().startswith("rq, version ")


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (["no-such-command"], b"No such command"),
        (["doctor", "--no-such-flag"], b"No such option"),
        (["--json", "doctor", "--cache-dir"], b"requires an argument"),
    ],
)
def test_usage_errors_are_one_line_with_where_to_look(args: list[str], text: bytes) -> None:
    res = run_rq(*args)
    assert res.returncode == ExitCode.USAGE
    assert text in res.stderr and res.stderr.count(b"\n") == 1 and b"--help" in res.stderr, res.stderr


def test_bare_rq_shows_the_help() -> None:
    res = run_rq()
    assert b"Commands:" in res.stdout + res.stderr


@pytest.mark.integration
def test_doctor_json_against_real_services(services: Services) -> None:
    res = run_rq(
        "doctor",
        "--json",
        "--endpoint-url",
        services.s3_endpoint,
        "--nats-url",
        services.nats_url,
        env=services.aws_env(),
    )
    assert res.returncode == 0, res.stderr
    lines = [json.loads(line) for line in res.stdout.decode().splitlines()]
    by_check = {o["check"]: o for o in lines if o["event"] == "finding"}
    assert by_check["s3"]["status"] == "ok"
    assert by_check["nats"]["status"] == "ok" and "JetStream" in by_check["nats"]["detail"]
    assert lines[-1]["event"] == "summary" and lines[-1]["ok"] is True


@pytest.mark.integration
@pytest.mark.parametrize("position", ["before", "after"])
def test_wrong_endpoint_one_line_and_exit_code(services: Services, position: str) -> None:
    args = ["doctor", "--endpoint-url", "http://127.0.0.1:1"]
    args = ["--json", *args] if position == "before" else [*args, "--json"]
    res = run_rq(*args, env=services.aws_env())
    assert res.returncode == ExitCode.UNREACHABLE
    err = res.stderr.decode().strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rq: error: ") and "Traceback" not in res.stderr.decode()
    json.loads(res.stdout.decode().splitlines()[-1])  # the report is still valid JSON lines


@pytest.mark.integration
def test_wrong_credentials_exit_auth(services: Services) -> None:
    env = {**services.aws_env(), "AWS_SECRET_ACCESS_KEY": "wrong"}
    res = run_rq("doctor", "-q", "--endpoint-url", services.s3_endpoint, env=env)
    assert res.returncode == ExitCode.AUTH
    assert b"credentials refused" in res.stderr


@pytest.mark.integration
@pytest.mark.parametrize(
    "broken",
    [{"AWS_SECRET_ACCESS_KEY": ""}, {"AWS_PROFILE": "rq-no-such-profile"}],
    ids=["half-a-key-pair", "missing-profile"],
)
def test_unusable_credentials_exit_auth_in_one_line(services: Services, broken: dict[str, str]) -> None:
    env = {**services.aws_env(), **broken}  # an empty secret: botocore's "Partial credentials found"
    res = run_rq("doctor", "--endpoint-url", services.s3_endpoint, env=env)
    err = res.stderr.decode()
    assert res.returncode == ExitCode.AUTH, err
    assert "credentials unusable" in err and err.count("\n") == 1 and "unexpected" not in err


@pytest.mark.integration
def test_missing_bucket_exit_not_found(services: Services) -> None:
    res = run_rq(
        "doctor",
        "-q",
        "--endpoint-url",
        services.s3_endpoint,
        "--bucket",
        "rq-no-such-bucket",
        env=services.aws_env(),
    )
    assert res.returncode == ExitCode.NOT_FOUND


@pytest.mark.parametrize(
    "args",
    [
        ["--endpoint-url", "not a url"],
        ["--endpoint-url", "http://127.0.0.1:99999"],
        ["--nats-url", "nats://127.0.0.1:99999"],
        ["--nats-url", "nats://127.0.0.1:port"],
    ],
)
def test_malformed_url_is_usage_error(args: list[str]) -> None:
    res = run_rq("doctor", *args)
    assert res.returncode == ExitCode.USAGE, res.stderr
    assert len(res.stderr.decode().strip().splitlines()) == 1 and b"unexpected" not in res.stderr


@pytest.mark.integration
def test_config_file_env_and_flag_precedence(tmp_path: Path, services: Services) -> None:
    """flag > RQ_* env > config file > default, shown through the NATS URL doctor reports."""
    bad = "nats://127.0.0.1:1"
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[doctor]\nnats-url = "{bad}"\n')

    def nats_detail(*args: str, env: dict[str, str] | None = None) -> str:
        res = run_rq(
            "--config", str(cfg), "doctor", "--json", *args, env={**services.aws_env(), **(env or {})}
        )
        return next(
            json.loads(line)["detail"]
            for line in res.stdout.decode().splitlines()
            if json.loads(line).get("check") == "nats"
        )

    assert nats_detail().startswith(bad)  # the config file's value
    assert nats_detail(env={"RQ_DOCTOR_NATS_URL": services.nats_url}).startswith(services.nats_url)
    assert nats_detail("--nats-url", services.nats_url, env={"RQ_DOCTOR_NATS_URL": bad}).startswith(
        services.nats_url
    )


def test_missing_explicit_config_is_usage_error(tmp_path: Path) -> None:
    res = run_rq("--config", str(tmp_path / "absent.toml"), "doctor")
    assert res.returncode == ExitCode.USAGE
    assert b"does not exist" in res.stderr


def test_invalid_config_is_usage_error(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("[doctor\n")
    res = run_rq("--config", str(cfg), "doctor")
    assert res.returncode == ExitCode.USAGE
    assert b"not valid TOML" in res.stderr


@pytest.mark.parametrize(
    ("body", "text"),
    [(b'x = "\xff"\n', b"not valid TOML"), (b"doctor = 5\n", b"must be a table")],
    ids=["not-utf8", "command-not-a-table"],
)
def test_odd_config_is_a_one_line_usage_error(tmp_path: Path, body: bytes, text: bytes) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_bytes(body)
    res = run_rq("--config", str(cfg), "doctor")
    assert res.returncode == ExitCode.USAGE, res.stderr
    assert text in res.stderr and res.stderr.count(b"\n") == 1 and b"unexpected" not in res.stderr


@pytest.mark.parametrize(
    ("body", "args", "text"),
    [
        (b"[cache]\nls = 5\n", ["cache", "ls"], b"[cache] 'ls' must be a table"),
        (b"[cache.du]\ncache-dir = 5\n", ["cache", "du"], b"[cache.du] cache-dir: 5 (int) is not a valid"),
        (b"[preload]\nworkers = [1]\n", ["preload", "/nonexistent"], b"[preload] workers:"),
        (b"[preload]\nbogus_option = 1\n", ["preload", "/nonexistent"], b"[preload] bogus_option: no such"),
        (b"[prelod]\nworkers = 1\n", ["doctor"], b"did you mean 'preload'"),
        # the keys as --help names them: it listed Click's `json_`, `to_spec` and the argument `words`
        (
            b"[offsets.reset]\nto = 'start'\n",
            ["offsets", "t"],
            b"known here: dry-run, group, json, quiet, to, topics-dir, verbose",
        ),
        (b"[offsets]\ntoo = 'start'\n", ["offsets", "t"], b"did you mean 'to'?"),
    ],
    ids=[
        "group-key-not-a-table",
        "wrong-type",
        "list-for-a-scalar",
        "unknown-key",
        "unknown-table",
        "known-keys-as-flags",
        "near-key-as-a-flag",
    ],
)
def test_config_keys_and_types_are_checked(tmp_path: Path, body: bytes, args: list[str], text: bytes) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_bytes(body)
    res = run_rq("--config", str(cfg), *args, env={"RQ_CACHE_DIR": str(tmp_path / "cache")})
    assert res.returncode == ExitCode.USAGE, res.stderr
    assert str(cfg).encode() in res.stderr and text in res.stderr, res.stderr
    assert res.stderr.count(b"\n") == 1 and b"unexpected" not in res.stderr


def test_config_string_for_a_repeatable_option_is_one_value(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.tar").write_bytes(b"a")
    (src / "b.txt").write_bytes(b"b")
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[preload]\ninclude = "*.tar"\ncache-dir = "{tmp_path / "cache"}"\n')
    res = run_rq("--config", str(cfg), "--json", "preload", str(src), "--dry-run")
    assert res.returncode == 0, res.stderr
    plans = [json.loads(x) for x in res.stdout.splitlines() if b'"plan"' in x]
    assert [p["url"].rsplit("/", 1)[1] for p in plans] == ["a.tar"]


def test_config_keys_may_be_the_option_names_the_docs_use(tmp_path: Path) -> None:
    """`from` for --from and `format` for --format, where Click's parameters are named otherwise
    (`from_spec`, `fmt`): both were refused as "no such option"."""
    env = {"RQ_TOPICS_DIR": str(tmp_path / "topics")}
    assert run_rq("produce", "t", "-q", input=b"1\n2\n3\n4\n", env=env).returncode == 0
    cfg = tmp_path / "c.toml"
    cfg.write_text('[replay]\nfrom = "-2"\nformat = "raw"\n')
    res = run_rq("--config", str(cfg), "replay", "t", env=env)
    assert (res.returncode, res.stdout) == (0, b"3\n4\n"), res.stderr


def test_safe_text_escapes_everything_that_could_drive_or_break_a_terminal() -> None:
    from rqcli.output import safe_text

    raw = "a\x1b[2Jb\x9b31mc\u202ed" + b"\xff.bin".decode("utf-8", "surrogateescape") + "é"
    shown = safe_text(raw)
    assert shown == "a\\x1b[2Jb\\x9b31mc\\u202ed\\xff.biné"
    shown.encode("utf-8")  # printable: a lone surrogate used to stop the output with an error


def test_the_default_config_file_is_read(tmp_path: Path) -> None:
    cfg = tmp_path / "xdg" / "rq" / "config.toml"
    cfg.parent.mkdir(parents=True)
    cfg.write_text("[doctor]\nbogus_option = 1\n")
    res = run_rq("doctor", env={"XDG_CONFIG_HOME": str(tmp_path / "xdg")})
    assert res.returncode == ExitCode.USAGE, res.stderr
    assert str(cfg).encode() in res.stderr and b"bogus_option" in res.stderr


def test_a_default_config_path_that_is_a_directory_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "xdg" / "rq" / "config.toml").mkdir(parents=True)
    res = run_rq("doctor", env={"XDG_CONFIG_HOME": str(tmp_path / "xdg")})
    assert res.returncode == ExitCode.USAGE, res.stderr
    assert b"cannot be read" in res.stderr and res.stderr.count(b"\n") == 1


def test_a_commands_own_variable_beats_the_well_known_one(tmp_path: Path) -> None:
    """RQ_CACHE_DU_CACHE_DIR was ignored whenever RQ_CACHE_DIR was set: the general beat the specific."""
    env = {"RQ_CACHE_DIR": str(tmp_path / "general"), "RQ_CACHE_DU_CACHE_DIR": str(tmp_path / "specific")}
    res = run_rq("cache", "du", env=env)
    assert res.returncode == ExitCode.NOT_FOUND and b"specific" in res.stderr, res.stderr
    res = run_rq("cache", "du", env={"RQ_CACHE_DIR": str(tmp_path / "general")})
    assert res.returncode == ExitCode.NOT_FOUND and b"general" in res.stderr, res.stderr


@pytest.mark.parametrize(
    ("args", "env", "text"),
    [
        (["preload", "/nonexistent"], {"RQ_PRELOAD_WORKERS": "x"}, b"'--workers' (from RQ_PRELOAD_WORKERS)"),
        # RQ_SEND_TIMEOUT was not read at all: Click's name for it was RQ_SEND_ACK_TIMEOUT
        (
            ["send", "/etc/hostname", "rq://127.0.0.1:9", "--transport", "tcp"],
            {"RQ_SEND_TIMEOUT": "nan", "RQ_TOKEN": "t"},
            b"'--timeout' (from RQ_SEND_TIMEOUT)",
        ),
    ],
    ids=["workers", "send-timeout"],
)
def test_a_bad_value_from_the_environment_names_its_variable(
    args: list[str], env: dict[str, str], text: bytes
) -> None:
    res = run_rq(*args, env=env)
    assert res.returncode == ExitCode.USAGE and text in res.stderr, res.stderr
    assert res.stderr.count(b"\n") == 1
