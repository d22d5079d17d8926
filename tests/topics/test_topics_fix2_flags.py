"""Flags of another kind of topic, empty filters, and topic URLs (review round fix2).

- `--no-retained` (MQTT only) from RQ_TAIL_NO_RETAINED or `[tail] no-retained = true` broke every
  `rq tail` of an embedded or NATS topic (exit 2): from the environment or the config file it is a
  default that applies where it means something, as RQ_MQTT_MAX_PACKET_SIZE is; typed, it is refused.
  `--segment-bytes`/`--retention-*` typed for a NATS or MQTT topic were dropped without a word.
- `--fields ''` and `--where ''` (an unset variable) read as "no filter": a replay of everything;
  `--record ''`, `--to-topic ''` and `--group ''` as not given.
- `nats://HOST:0/S` connected to 4222; `NATS://` was an unknown scheme (schemes are case-insensitive).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rqtest import run_rq

from rqcli.exitcodes import ExitCode
from topics.sources.open import parse_topic


def _topic(tmp_path: Path) -> dict[str, str]:
    env = {"RQ_TOPICS_DIR": str(tmp_path / "topics")}
    assert run_rq("produce", "ev", "-q", input=b"1\n2\n3\n", env=env).returncode == 0
    return env


def _one_line_usage(res: object, text: str) -> None:
    assert res.returncode == ExitCode.USAGE, res.stderr  # type: ignore[attr-defined]
    err = res.stderr.decode()  # type: ignore[attr-defined]
    assert text in err and err.count("\n") == 1, err


def test_no_retained_from_the_environment_or_config_is_a_default_for_mqtt_only(tmp_path: Path) -> None:
    env = _topic(tmp_path)
    res = run_rq("tail", "ev", "-n", "1", "--format", "raw", env={**env, "RQ_TAIL_NO_RETAINED": "1"})
    assert (res.returncode, res.stdout) == (0, b"3\n"), res.stderr
    cfg = tmp_path / "c.toml"
    cfg.write_text("[tail]\nno-retained = true\n")
    res = run_rq("--config", str(cfg), "tail", "ev", "-n", "1", "--format", "raw", env=env)
    assert (res.returncode, res.stdout) == (0, b"3\n"), res.stderr
    # typed, on a topic it does nothing for, it is still refused rather than ignored
    _one_line_usage(run_rq("tail", "ev", "--no-retained", env=env), "--no-retained is for MQTT topics")


@pytest.mark.parametrize("flag", ["--segment-bytes", "--retention-bytes", "--retention-age"])
def test_embedded_only_flags_typed_for_a_server_topic_are_refused(tmp_path: Path, flag: str) -> None:
    # port 1: the old code went on to connect (exit 6) with the flag dropped
    res = run_rq("produce", "nats://127.0.0.1:1/S", flag, "1d" if "age" in flag else "1M", input=b"x\n")
    _one_line_usage(res, f"{flag} is for embedded topics")


def test_embedded_only_flags_from_the_environment_stay_defaults(tmp_path: Path) -> None:
    env = {**_topic(tmp_path), "RQ_PRODUCE_SEGMENT_BYTES": "1M"}
    res = run_rq("produce", "nats://127.0.0.1:1/S", input=b"x\n", env=env)
    assert res.returncode == ExitCode.UNREACHABLE, res.stderr  # went on to connect: not refused


@pytest.mark.parametrize(
    ("command", "flag"),
    [
        ("tail", "--fields"),
        ("tail", "--where"),
        ("tail", "--record"),  # nothing recorded, exit 0
        ("replay", "--fields"),
        ("replay", "--where"),
        ("replay", "--to-topic"),  # printed instead of copied, exit 0
        ("replay", "--group"),  # read with no group
        ("offsets", "--group"),
    ],
)
def test_an_empty_value_is_refused_not_taken_for_none(tmp_path: Path, command: str, flag: str) -> None:
    env = _topic(tmp_path)
    res = run_rq(command, "ev", flag, "", env=env)
    _one_line_usage(res, f"{flag} is empty")
    assert res.stdout == b""


@pytest.mark.parametrize(
    "url",
    [
        "nats://127.0.0.1:0/S",
        "tls://127.0.0.1:0/S",
        "mqtt://127.0.0.1:0/t",
        "nats://127.0.0.1:65536/S",
        "mqtt://127.0.0.1:99999/t",
        "nats://127.0.0.1:x/S",
    ],
)
def test_a_port_of_zero_or_out_of_range_is_a_usage_error(url: str) -> None:
    _one_line_usage(run_rq("tail", url), "bad port in")


def test_url_schemes_are_case_insensitive(tmp_path: Path) -> None:
    ref = parse_topic("NATS://127.0.0.1:14222/S/a.b", tmp_path)
    assert (ref.kind, ref.port, ref.stream, ref.subject, ref.tls) == ("jetstream", 14222, "S", "a.b", False)
    assert parse_topic("Mqtts://h/t/#", tmp_path).url == "mqtts://h:8883/t/#"
    assert parse_topic("TLS://h/S", tmp_path).url == "tls://h:4222/S"
    assert parse_topic("nats://h:/S", tmp_path).port == 4222  # an empty port is the scheme's
    # on the command line: taken as a NATS URL (nothing listens on port 1), not an unknown scheme
    res = run_rq("tail", "NATS://127.0.0.1:1/S", "--json")
    assert res.returncode == ExitCode.UNREACHABLE, res.stderr


def test_a_topic_name_says_it_must_start_with_a_letter_or_digit(tmp_path: Path) -> None:
    res = run_rq("produce", "--", "-weird", input=b"x\n", env={"RQ_TOPICS_DIR": str(tmp_path)})
    _one_line_usage(res, "starting with a letter or digit")
    assert list(tmp_path.iterdir()) == []


def test_the_commit_done_line_names_group_and_offset(tmp_path: Path) -> None:
    """docs/topics.md "Exit codes" said `committed` is an offset: it is {"group", "offset"}."""
    env = _topic(tmp_path)
    res = run_rq("replay", "ev", "--group", "g", "--commit", "--json", "--format", "raw", env=env)
    assert res.returncode == 0, res.stderr
    done = json.loads(res.stdout.splitlines()[-1])
    assert done["committed"] == {"group": "g", "offset": 3}
