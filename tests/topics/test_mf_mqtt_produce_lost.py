"""`rq produce mqtt://` when the broker goes away: the one line and exit 6 of a lost connection,
with what the broker acknowledged of the input, and the packet-size guess only where it fits.

A Mosquitto of the test's own (ports 19100-19149) for a broker killed or stopped between batches;
fake brokers (rqtest.serving) where a PUBACK must come for one record and not the next."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from subprocess import PIPE

import pytest
from jskit import freeze
from mqttkit import own_mosquitto
from rqtest import quietly, read_packet, run_rq, serving

from rqcli.exitcodes import ExitCode

needs_mosquitto = pytest.mark.skipif(shutil.which("mosquitto") is None, reason="no mosquitto here")

_ACK_WAIT = "import topics.sources.mqtt as m\nm.MqttSink.ACK_WAIT_S = 1.0"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    with own_mosquitto(tmp_path, range(19100, 19150)) as (proc, port):
        yield proc, port


def _first_batch_acked(port: int, setup: str = "") -> subprocess.Popen[bytes]:
    """`rq produce --json` with one record in, its ack read back: the first batch is the broker's."""
    code = f"{setup}\nimport sys\nsys.argv[0] = 'rq'\nfrom rqcli.console import main\nmain()\n"
    args = ("produce", "--json", f"mqtt://127.0.0.1:{port}/mf/lost")
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdin=PIPE, stdout=PIPE, stderr=PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(b"one\n")
    proc.stdin.flush()
    ack = json.loads(proc.stdout.readline())
    assert ack["event"] == "ack" and ack["records"] == 1, ack
    return proc


def _connections_to(port: int) -> bool:
    """A TCP connection to `port` still open at rq's end (established, or closed by the peer and
    not yet by rq: CLOSE_WAIT)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[2].split(":")[1], 16) == port and fields[3] in ("01", "08"):
                return True
    return False


def _finish(proc: subprocess.Popen[bytes], more: bytes) -> tuple[int, str, list[dict[str, object]]]:
    out, err = proc.communicate(more, timeout=60)
    return proc.returncode, err.decode(), [json.loads(line) for line in out.splitlines()]


@needs_mosquitto
def test_a_broker_gone_between_batches_is_a_lost_connection(
    broker: tuple[subprocess.Popen[bytes], int],
) -> None:
    """Old: "unexpected RuntimeError: Message publish failed: The client is not currently
    connected", exit 1 (paho's error from a publish made while it knew the connection gone)."""
    mosquitto, port = broker
    proc = _first_batch_acked(port)
    mosquitto.kill()
    mosquitto.wait(10)
    import time

    deadline = time.monotonic() + 20
    while _connections_to(port) and time.monotonic() < deadline:  # paho has seen the close
        time.sleep(0.02)
    rc, err, lines = _finish(proc, b"two\n")
    assert rc == ExitCode.UNREACHABLE, err
    assert err.count("\n") == 1 and "lost the connection to the MQTT broker" in err, err
    assert "unexpected" not in err and "RuntimeError" not in err, err
    assert "max_packet_size" not in err, err  # 7 bytes, the size of one the broker took
    done = lines[-1]
    assert done["event"] == "done" and done["records"] == 1, done


@needs_mosquitto
def test_a_stalled_broker_is_named_with_what_it_left_unacknowledged(
    broker: tuple[subprocess.Popen[bytes], int],
) -> None:
    """Old: "the MQTT broker did not acknowledge a publish to mf/lost": no broker, no count."""
    mosquitto, port = broker
    proc = _first_batch_acked(port, _ACK_WAIT)
    freeze(mosquitto)
    rc, err, lines = _finish(proc, b"two\nthree\n")
    assert rc == ExitCode.UNREACHABLE, err
    assert f"MQTT broker at 127.0.0.1:{port} did not acknowledge" in err, err
    assert "2 publish(es) unacknowledged" in err, err
    assert "the first 1 record(s) of the input were acknowledged, record 2 and later ones not" in err, err
    assert lines[-1]["records"] == 1, lines


_served = threading.Lock()


@quietly
def _acks_one_then_closes(conn: socket.socket) -> None:
    """PUBACKs the first PUBLISH, closes the connection on the second (paho's reconnection
    afterwards gets nothing)."""
    if not _served.acquire(blocking=False):
        return
    try:
        assert read_packet(conn)[0] >> 4 == 1  # CONNECT
        conn.sendall(b"\x20\x02\x00\x00")  # CONNACK, accepted
        first = read_packet(conn)
        assert first[0] >> 4 == 3  # PUBLISH, QoS 1: topic length, topic, then the packet id
        at = 1 + 2 + int.from_bytes(first[1:3], "big")
        conn.sendall(b"\x40\x02" + first[at : at + 2])  # PUBACK
        assert read_packet(conn)[0] >> 4 == 3
        conn.shutdown(socket.SHUT_RDWR)
    finally:
        _served.release()


@pytest.mark.parametrize("json_mode", [False, True])
def test_a_loss_inside_a_batch_counts_what_the_broker_acknowledged(json_mode: bool) -> None:
    """Old: no record counted (the batch's plain ConnectionLost), and nothing said of the one
    acknowledged in the human line; the packet-size guess for 5 KB though the broker took 100 B."""
    with serving(_acks_one_then_closes) as port:
        flags = ["--json"] if json_mode else []
        r = run_rq(
            "produce", *flags, f"mqtt://127.0.0.1:{port}/x", input=b"a" * 100 + b"\n" + b"b" * 5000 + b"\n"
        )
    err = r.stderr.decode()
    assert r.returncode == ExitCode.UNREACHABLE, err
    assert "the first 1 record(s) of the input were acknowledged, record 2 and later ones not" in err, err
    assert "the largest 5005 bytes" in err and "max_packet_size" in err, err  # over anything taken
    if json_mode:
        done = json.loads(r.stdout.splitlines()[-1])
        assert done["records"] == 1 and done["first_offset"] is None, done


@quietly
def _closes_on_publish(conn: socket.socket) -> None:
    assert read_packet(conn)[0] >> 4 == 1  # CONNECT
    conn.sendall(b"\x20\x02\x00\x00")  # CONNACK, accepted
    if read_packet(conn)[0] >> 4 == 3:  # PUBLISH (QoS 1): closed without a PUBACK
        conn.shutdown(socket.SHUT_RDWR)  # (paho's reconnection after it sends DISCONNECT)


def test_small_publishes_lost_get_no_packet_size_guess() -> None:
    """Old: "… the largest 7 bytes: a broker closes it on a packet over its size limit …"."""
    with serving(_closes_on_publish) as port:
        r = run_rq("produce", f"mqtt://127.0.0.1:{port}/x", input=b"one\n")
    err = r.stderr.decode()
    assert r.returncode == ExitCode.UNREACHABLE, err
    assert "lost the connection" in err and "no record of the input was acknowledged" in err, err
    assert "max_packet_size" not in err and "--max-packet-size" not in err, err


def test_a_record_over_the_limit_is_named_by_its_place_in_the_input() -> None:
    """Old: "record 2 of the batch" (the input's batches are rq's own business)."""
    with serving(_closes_on_publish) as port:
        r = run_rq(
            "produce",
            f"mqtt://127.0.0.1:{port}/x",
            "--max-packet-size",
            "1000",
            input=b"a\n" + b"b" * 1500 + b"\n",
        )
    err = r.stderr.decode()
    assert r.returncode == ExitCode.USAGE, err
    assert "record 2 of the input is an MQTT packet of 1505 bytes" in err, err
