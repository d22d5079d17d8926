"""rq produce to an MQTT broker that closes the connection before acknowledging: the line says so
in words, not paho's "Unspecified error" (its name for a closed socket under MQTT 3.1.1)."""

from __future__ import annotations

import socket

import pytest
from rqtest import quietly, read_packet, run_rq, serving

pytestmark = pytest.mark.integration


def test_a_broker_gone_before_its_puback_is_said_in_words() -> None:
    @quietly
    def closes_on_publish(conn: socket.socket) -> None:
        assert read_packet(conn)[0] >> 4 == 1  # CONNECT
        conn.sendall(b"\x20\x02\x00\x00")  # CONNACK, accepted
        assert read_packet(conn)[0] >> 4 == 3  # PUBLISH (QoS 1): closed without a PUBACK
        conn.shutdown(socket.SHUT_RDWR)

    with serving(closes_on_publish) as port:
        r = run_rq("produce", f"mqtt://127.0.0.1:{port}/x", input=b"one\n", timeout=60)
    assert r.returncode == 6, r.stderr
    # Old: "… closed the connection (Unspecified error) with 1 publish(es) …"
    assert b"the broker closed the connection (or it was reset)" in r.stderr, r.stderr
    assert b"Unspecified error" not in r.stderr and r.stderr.count(b"\n") == 1
