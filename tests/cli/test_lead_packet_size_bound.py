"""--max-packet-size above MQTT's largest packet (268,435,455 bytes) is refused before connecting,
from the flag or RQ_MQTT_MAX_PACKET_SIZE; 256M, the figure the help names, is that largest packet."""

from __future__ import annotations

import pytest
from rqtest import run_rq

from rqcli.commands.topics import MQTT_PACKET_LIMIT, _packet_size_option
from rqcli.exitcodes import ExitCode

NOWHERE = "mqtt://127.0.0.1:9/t"  # never reached: the value is refused first


@pytest.mark.parametrize("command", ["tail", "produce"])
def test_a_packet_size_over_mqtts_limit_is_refused(command: str) -> None:
    res = run_rq(command, NOWHERE, "--max-packet-size", "10GB", input=b"")
    assert res.returncode == ExitCode.USAGE, res.stderr
    assert b"over MQTT's largest packet" in res.stderr


def test_the_variable_is_checked_too() -> None:
    res = run_rq("tail", NOWHERE, env={"RQ_MQTT_MAX_PACKET_SIZE": "300M"})
    assert res.returncode == ExitCode.USAGE, res.stderr
    assert b"(from RQ_MQTT_MAX_PACKET_SIZE)" in res.stderr and b"over MQTT's largest packet" in res.stderr


def test_256m_is_the_largest_packet() -> None:
    assert _packet_size_option(None, None, "256M") == MQTT_PACKET_LIMIT  # type: ignore[arg-type]
    assert _packet_size_option(None, None, "1M") == 1 << 20  # type: ignore[arg-type]
