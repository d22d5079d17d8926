"""One-line refusals for flags and URLs that cannot apply (topics loose ends of issue #5).

- `--skip-corrupt` with a NATS or MQTT topic was taken and did nothing (a server's stream never
  serves a corrupt record): typed, it is refused as other one-kind flags are (exit 2); from
  RQ_REPLAY_SKIP_CORRUPT / RQ_TAIL_SKIP_CORRUPT or the config file it stays a default.
- `rq doctor --nats-url` with port 0 printed the whole table and then "unreachable (Connection
  refused)", exit 6; `nats://[::1` was "unexpected ValueError", exit 1; `--nats-url ''` checked
  the default server as if the flag were not given. An uppercase scheme works (a guard).
"""

from __future__ import annotations

import pytest
from rqtest import run_rq

from rqcli.exitcodes import ExitCode

_NOWHERE = "nats://127.0.0.1:1/S"  # nothing listens: a refusal comes before any connect


def _one_line_usage(res: object, text: str) -> None:
    assert res.returncode == ExitCode.USAGE, res.stderr  # type: ignore[attr-defined]
    err = res.stderr.decode()  # type: ignore[attr-defined]
    assert text in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert res.stdout == b""  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "args",
    [
        ("replay", _NOWHERE, "--from", "start"),
        ("tail", _NOWHERE, "-n", "1"),
        ("tail", "mqtt://127.0.0.1:1/t", "-n", "1"),
    ],
)
def test_skip_corrupt_typed_for_a_server_topic_is_refused(args: tuple[str, ...]) -> None:
    _one_line_usage(run_rq(*args, "--skip-corrupt"), "--skip-corrupt is for embedded topics")


def test_skip_corrupt_from_the_environment_stays_a_default() -> None:
    res = run_rq("replay", _NOWHERE, "--from", "start", env={"RQ_REPLAY_SKIP_CORRUPT": "1"})
    assert res.returncode == ExitCode.UNREACHABLE, res.stderr  # went on to connect: not refused


@pytest.mark.parametrize(
    ("url", "text"),
    [
        ("nats://127.0.0.1:0", "its port must be a number from 1 to 65535"),
        ("nats://:0", "is not a nats:// URL"),
        ("nats://:4222", "is not a nats:// URL"),  # no host
        ("nats://[::1", "is not a nats:// URL"),
        ("nats://u:secret@[::1", "is not a nats:// URL"),
        ("", "--nats-url is empty"),
    ],
)
def test_doctor_refuses_a_nats_url_it_cannot_use_in_one_line(url: str, text: str) -> None:
    res = run_rq("doctor", "--nats-url", url)
    _one_line_usage(res, text)
    assert b"secret" not in res.stderr


def test_doctor_takes_an_uppercase_scheme() -> None:
    res = run_rq("doctor", "--json", "--nats-url", "NATS://127.0.0.1:1")  # nothing there: unreachable
    assert res.returncode == ExitCode.UNREACHABLE, res.stderr
    assert b"unreachable" in res.stderr and res.stderr.count(b"\n") == 1
