"""MQTT tail: what a user is told when the filter, the server or the connection is not what rq
expects (a NUL in the filter, a port that is not MQTT, a broker that closes on SUBSCRIBE or goes
away mid-tail): one line, the documented exit code, the reason in words."""

from __future__ import annotations

import socket

import pytest
from rqtest import quietly, read_packet, run_rq, serving

pytestmark = pytest.mark.integration


def test_a_nul_in_the_filter_is_a_bad_spec_not_a_refused_subscription(mqtt_url: str) -> None:
    # Old: paho sent it, mosquitto closed the connection, rq waited 5 s and said "MQTT broker
    # refused the subscription" (exit 6).
    r = run_rq("tail", f"{mqtt_url}/a%00b", "--timeout", "1", timeout=60)
    assert r.returncode == 2, r.stderr
    assert b"U+0000" in r.stderr and r.stderr.count(b"\n") == 1


def test_a_server_that_is_not_mqtt_is_said_to_be_so() -> None:
    @quietly
    def nats_like(conn: socket.socket) -> None:
        conn.sendall(
            b'INFO {"server_id":"NDXYZ","version":"2.10.0","proto":1,"host":"0.0.0.0","port":4222,"max_payload":1048576}\r\n'
        )
        conn.recv(1024)  # until rq closes it

    with serving(nats_like) as port:
        r = run_rq("tail", f"mqtt://127.0.0.1:{port}/x", "--timeout", "1", timeout=60)
    # Old: "closed the connection before answering CONNECT: connection closed"
    assert r.returncode == 6, r.stderr
    assert b"answered CONNECT with something that is not MQTT" in r.stderr, r.stderr
    assert r.stderr.count(b"\n") == 1


def test_a_broker_that_closes_on_subscribe_is_said_to_have_closed_it() -> None:
    @quietly
    def closes_on_subscribe(conn: socket.socket) -> None:
        assert read_packet(conn)[0] >> 4 == 1  # CONNECT
        conn.sendall(b"\x20\x02\x00\x00")  # CONNACK, accepted
        read_packet(conn)  # SUBSCRIBE: closed without a SUBACK
        conn.shutdown(socket.SHUT_RDWR)

    with serving(closes_on_subscribe) as port:
        r = run_rq("tail", f"mqtt://127.0.0.1:{port}/x/#", "--timeout", "1", timeout=60)
    # Old: a wait of the connect timeout, then "MQTT broker refused the subscription to 'x/#'"
    assert r.returncode == 6, r.stderr
    assert (
        f"MQTT broker at 127.0.0.1:{port} closed the connection on the subscription to 'x/#'".encode()
        in r.stderr
    )
    assert r.stderr.count(b"\n") == 1


def test_a_broker_gone_mid_tail_is_said_in_words() -> None:
    @quietly
    def publishes_then_closes(conn: socket.socket) -> None:
        assert read_packet(conn)[0] >> 4 == 1  # CONNECT
        conn.sendall(b"\x20\x02\x00\x00")  # CONNACK, accepted
        sub = read_packet(conn)  # SUBSCRIBE: 0x82, length, packet id, ...
        conn.sendall(b"\x90\x03" + sub[2:4] + b"\x00")  # SUBACK, QoS 0 granted
        topic = b"gone/1"
        body = len(topic).to_bytes(2, "big") + topic + b"before"
        conn.sendall(bytes([0x30, len(body)]) + body)  # PUBLISH, QoS 0
        conn.shutdown(socket.SHUT_RDWR)  # and gone

    with serving(publishes_then_closes) as port:
        r = run_rq("tail", f"mqtt://127.0.0.1:{port}/gone/#", "--format", "raw", timeout=60)
    assert r.returncode == 6, r.stderr
    assert r.stdout == b"before\n"  # what arrived before the loss is written first
    # Old: "lost the connection to the MQTT broker at H:P: Unspecified error"
    assert b"lost the connection to the MQTT broker" in r.stderr and b"Unspecified error" not in r.stderr
    assert b"the broker closed the connection" in r.stderr and r.stderr.count(b"\n") == 2  # + listening


def test_a_refused_subscription_names_the_broker() -> None:
    @quietly
    def refuses(conn: socket.socket) -> None:
        assert read_packet(conn)[0] >> 4 == 1  # CONNECT
        conn.sendall(b"\x20\x02\x00\x00")  # CONNACK, accepted
        sub = read_packet(conn)
        conn.sendall(b"\x90\x03" + sub[2:4] + b"\x80")  # SUBACK: failure
        conn.recv(1024)

    with serving(refuses) as port:
        r = run_rq("tail", f"mqtt://127.0.0.1:{port}/x/#", "--timeout", "1", timeout=60)
    # Old: "MQTT broker refused the subscription to 'x/#'" (which broker, not said)
    assert r.returncode == 4, r.stderr
    assert f"MQTT broker at 127.0.0.1:{port} refused the subscription to 'x/#'".encode() in r.stderr
    assert r.stderr.count(b"\n") == 1
