"""The config file's edges: an empty RQ_CONFIG, `--config ''`, `~`, /dev/null as "no file"; the --json
summary `rq send` owes when the file is refused; and errors that name where a value came from (the
file's table and key as the file spells it, or the environment variable)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rqtest import home_config, home_env, run_rq

from rqcli.exitcodes import ExitCode

DEST = "rq://127.0.0.1:21612"  # never reached: every run here stops before connecting


def _du(tmp_path: Path, *args: str, **env: str) -> tuple[int, str]:
    """`rq cache du` of a cache that is not there: exit 3 once the config file let it run."""
    res = run_rq(
        *args, "cache", "du", "--cache-dir", str(tmp_path / "no-cache"), env=home_env(tmp_path, **env)
    )
    return res.returncode, res.stderr.decode()


def test_an_empty_rq_config_counts_as_unset(tmp_path: Path) -> None:
    """Old: exit 2, 'config file ~/.config/rq/config.toml does not exist' (no file was named)."""
    code, err = _du(tmp_path, RQ_CONFIG="")
    assert code == ExitCode.NOT_FOUND and "config file" not in err, err


def test_an_empty_config_flag_says_it_is_empty(tmp_path: Path) -> None:
    """Old: 'config file . cannot be read: it is a directory, not a regular file'."""
    code, err = _du(tmp_path, "--config", "")
    assert code == ExitCode.USAGE and "--config" in err and "empty string" in err, err
    assert "directory" not in err


@pytest.mark.parametrize("how", ["flag", "env"])
def test_a_tilde_in_the_config_path_is_the_home_directory(tmp_path: Path, how: str) -> None:
    """Old: 'config file ~/x.toml does not exist', from the flag and from RQ_CONFIG alike."""
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "x.toml").write_text("[cache.du]\nbogus = 1\n")
    code, err = (
        _du(tmp_path, "--config", "~/x.toml") if how == "flag" else _du(tmp_path, RQ_CONFIG="~/x.toml")
    )
    assert code == ExitCode.USAGE and f"{tmp_path}/home/x.toml: [cache.du] bogus: no such option" in err, err


@pytest.mark.parametrize("how", ["flag", "env"])
def test_dev_null_is_no_config_file(tmp_path: Path, how: str) -> None:
    """Old: 'config file /dev/null cannot be read: it is a device', exit 2. /dev/null switches the
    file off (the default one too), as for git and pip; another device is still refused."""
    home_config(tmp_path, "[cache.du]\nbogus = 1\n")
    code, err = (
        _du(tmp_path, "--config", "/dev/null") if how == "flag" else _du(tmp_path, RQ_CONFIG="/dev/null")
    )
    assert code == ExitCode.NOT_FOUND and "config file" not in err, err
    code, err = _du(tmp_path, "--config", "/dev/zero")
    assert code == ExitCode.USAGE and "it is a device" in err, err


@pytest.mark.parametrize(
    ("text", "said"),
    [("[send]\nconnections = 0\n", "[send] connections: 0"), ("[send]\nbogus = 0\n", "[send] bogus")],
)
def test_send_json_prints_its_summary_when_the_config_file_is_refused(
    tmp_path: Path, text: str, said: str
) -> None:
    """Old: exit 2 and stdout empty (RQ_SEND_CONNECTIONS=0 and --connections 0 printed the summary)."""
    path = home_config(tmp_path, text)
    (tmp_path / "a.txt").write_text("a")
    res = run_rq("send", str(tmp_path / "a.txt"), DEST, "--json", env=home_env(tmp_path))
    assert res.returncode == ExitCode.USAGE, res.stderr
    summary = json.loads(res.stdout.decode().splitlines()[-1])
    assert summary["event"] == "summary" and summary["transfer_id"] is None, summary
    assert f"config file {path}: {said}" in summary["error"], summary
    assert res.stderr.decode() == f"rq: error: {summary['error']}\n"


@pytest.mark.parametrize(
    ("text", "env", "args", "said"),
    [
        (
            '[send]\nchunk-size = "10GB"\n',
            {},
            ["send", "{a}", DEST],
            "[send] chunk-size: --chunk-size must be",
        ),
        (
            "",
            {"RQ_SEND_CHUNK_SIZE": "10GB"},
            ["send", "{a}", DEST],
            "--chunk-size (from RQ_SEND_CHUNK_SIZE) must be",
        ),
        ('[doctor]\nnats-url = ""\n', {}, ["doctor"], "[doctor] nats-url: --nats-url is empty"),
        (
            '[tail]\nformat = ""\n',
            {},
            ["tail", "t", "--topics-dir", "{t}"],
            "[tail] format: --format is empty",
        ),
        ('[tail]\nwhere = "(("\n', {}, ["tail", "t", "--topics-dir", "{t}"], "[tail] where: bad --where"),
        (
            "",
            {"AWS_ENDPOINT_URL": "127.0.0.1:18333", "AWS_ENDPOINT_URL_S3": "", "AWS_ACCESS_KEY_ID": "k"},
            ["preload", "s3://b/x", "--cache-dir", "{t}"],
            "got '127.0.0.1:18333' (from AWS_ENDPOINT_URL)",
        ),
    ],
)
def test_a_refused_value_names_where_it_came_from(
    tmp_path: Path, text: str, env: dict[str, str], args: list[str], said: str
) -> None:
    """Old: '--chunk-size must be between …', '--nats-url is empty …', 'endpoint URL must be …'
    with neither the file's table and key nor the variable."""
    path = home_config(tmp_path, text)
    (tmp_path / "a.txt").write_text("a")
    words = [w.format(a=tmp_path / "a.txt", t=tmp_path / "t") for w in args]
    res = run_rq(*words, env=home_env(tmp_path, AWS_SECRET_ACCESS_KEY="s", **env))
    err = res.stderr.decode()
    assert res.returncode == ExitCode.USAGE and said in err and err.count("\n") == 1, err
    if text:
        assert f"config file {path}: {said}" in err, err
