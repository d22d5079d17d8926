"""`rq produce` (and `rq tail`) to MQTT: a broker that was up and dropped the connection ended
the error line with "— is the server running and the URL right?", a hint for a server that could
not be reached at all. It is now given only there (connection refused); a loss after the broker
answered says what happened and nothing more. Fake brokers (a fixed answer, then a close)."""

from __future__ import annotations

import socket

import pytest
from rqtest import quietly, read_packet, run_rq, serving

from rqcli.exitcodes import ExitCode

HINT = "is the server running"


@quietly
def _drops_the_connection(conn: socket.socket) -> None:
    """Accepts the connection, answers a SUBSCRIBE (granted) but never a PUBLISH, then closes."""
    assert read_packet(conn)[0] >> 4 == 1  # CONNECT
    conn.sendall(b"\x20\x02\x00\x00")  # CONNACK, accepted
    packet = read_packet(conn)  # PUBLISH (QoS 1) from produce, SUBSCRIBE from tail
    if packet[0] >> 4 == 8:
        conn.sendall(b"\x90\x03" + packet[2:4] + b"\x00")  # SUBACK: granted, QoS 0
    conn.shutdown(socket.SHUT_RDWR)


@pytest.mark.parametrize(
    ("command", "said"),
    [("produce", "closed the connection"), ("tail", "lost the connection to the MQTT broker")],
)
def test_a_broker_that_dropped_the_connection_gets_no_is_it_running_hint(command: str, said: str) -> None:
    with serving(_drops_the_connection) as port:
        r = run_rq(command, f"mqtt://127.0.0.1:{port}/x", input=b"one\n", timeout=60)
    err = r.stderr.decode()
    assert r.returncode == ExitCode.UNREACHABLE, err
    assert said in err and err.count("rq: error") == 1, err
    assert HINT not in err, err  # was: "… — is the server running and the URL right?"


def test_a_refused_connection_keeps_the_hint() -> None:
    with socket.socket() as held:  # bound, never listening: a connect there is refused
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        r = run_rq("produce", f"mqtt://127.0.0.1:{port}/x", input=b"one\n", timeout=60)
    err = r.stderr.decode()
    assert r.returncode == ExitCode.UNREACHABLE and "Connection refused" in err, err
    assert HINT in err, err
