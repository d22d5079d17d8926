"""rq tail on MQTT takes packets up to a bound (--max-packet-size, RQ_MQTT_MAX_PACKET_SIZE,
default 16 MiB), checked on the length a packet declares before any of its body is buffered.

On the old code a broker declaring a 256 MiB PUBLISH had `rq tail … --format table` buffer it
(833 MB RSS) and print it: paho reads whatever the fixed header declares."""

from __future__ import annotations

import resource
import subprocess
import uuid

import pytest
from hostile_kit import fake_mqtt
from mqttkit import mqtt_publish
from rqtest import rq_command, run_rq

from rqcli.exitcodes import ExitCode

_MQTT_MAX = 268435455  # the largest remaining length MQTT can declare
_AS_LIMIT = 1536 * 1024 * 1024  # the old code then fails with MemoryError, not the machine


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (_AS_LIMIT, _AS_LIMIT))


def test_a_packet_over_the_limit_is_refused_before_it_is_buffered() -> None:
    with fake_mqtt(_MQTT_MAX) as seen:
        out = subprocess.run(
            [
                *rq_command(),
                "tail",
                f"mqtt://127.0.0.1:{seen.port}/sensors/#",
                "--format",
                "table",
                "-n",
                "1",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            preexec_fn=_limited,
            check=False,
        )
    err = [line for line in out.stderr.splitlines() if not line.startswith("rq: listening")]
    assert out.returncode == ExitCode.FAILURE, out.stderr
    assert out.stdout == "" and len(err) == 1, out.stderr
    assert f"MQTT broker at 127.0.0.1:{seen.port}" in err[0] and str(_MQTT_MAX) in err[0], err
    assert "--max-packet-size" in err[0], err
    assert seen.pushed and max(seen.pushed) < 64 * 1024 * 1024


@pytest.mark.integration
def test_the_limit_is_raised_by_flag_or_environment(mqtt_url: str) -> None:
    """A real broker's 2 MiB retained message: refused under 1M, shown under 4M."""
    topic = f"rqtest/big-{uuid.uuid4().hex[:8]}"
    value = b"v" * (2 * 1024 * 1024)
    mqtt_publish(mqtt_url, topic, value, retain=True)
    try:
        small = run_rq("tail", f"{mqtt_url}/{topic}", "-n", "1", "--format", "raw", "--max-packet-size", "1M")
        assert small.returncode == ExitCode.FAILURE, small.stderr
        assert b"more than rq takes (1048576 bytes)" in small.stderr and small.stdout == b""
        big = run_rq(
            "tail",
            f"{mqtt_url}/{topic}",
            "-n",
            "1",
            "--format",
            "raw",
            env={"RQ_MQTT_MAX_PACKET_SIZE": "4M"},
        )
        assert big.returncode == 0, big.stderr
        assert big.stdout == value + b"\n"
    finally:
        mqtt_publish(mqtt_url, topic, b"", retain=True)  # an empty retained message removes it


def test_the_flag_is_for_mqtt_topics(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = run_rq("tail", "events", "--max-packet-size", "1M", "--topics-dir", str(tmp_path))
    assert out.returncode == ExitCode.USAGE and b"--max-packet-size is for MQTT" in out.stderr
