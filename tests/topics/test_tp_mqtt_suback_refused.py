"""A broker refusing a subscription (SUBACK return code 0x80: its ACL does not let this client
read the filter) was exit 6, as if the broker were unreachable or the connection lost; it is an
authorization matter, exit 4, said in one line naming the broker, the filter and who rq was.
mosquitto 2.0 grants what its ACL denies (and then sends nothing), so a fake broker answers."""

from __future__ import annotations

import socket

import pytest
from rqtest import quietly, read_packet, run_rq, serving

from rqcli.exitcodes import ExitCode


@quietly
def _refuses(conn: socket.socket) -> None:
    assert read_packet(conn)[0] >> 4 == 1  # CONNECT
    conn.sendall(b"\x20\x02\x00\x00")  # CONNACK, accepted
    sub = read_packet(conn)
    assert sub[0] >> 4 == 8  # SUBSCRIBE
    conn.sendall(b"\x90\x03" + sub[2:4] + b"\x80")  # SUBACK: failure
    conn.recv(1024)  # until rq closes it


@pytest.mark.parametrize(("userinfo", "who"), [("", "without credentials"), ("bob:pw@", "as user 'bob'")])
def test_a_refused_subscription_is_access_denied(userinfo: str, who: str) -> None:
    with serving(_refuses) as port:
        r = run_rq("tail", f"mqtt://{userinfo}127.0.0.1:{port}/sensors/#", "--timeout", "1", timeout=60)
    assert r.returncode == ExitCode.AUTH, r.stderr  # was 6
    err = r.stderr.decode()
    assert f"MQTT broker at 127.0.0.1:{port} refused the subscription to 'sensors/#'" in err, err
    assert f"connected {who}, may not read it" in err and "pw" not in err, err
    assert err.count("\n") == 1, err
