"""The wire-level JetStream reader's frame handling, fed crafted bytes (pure logic; the real server
path is covered by test_jetstream.py)."""

from __future__ import annotations

import socket

import pytest

from topics.errors import ProtocolViolation
from topics.sources.natswire import OrderedReader, frame_limit


def reader_with(data: bytes) -> tuple[OrderedReader, socket.socket]:
    ours, theirs = socket.socketpair()
    r = OrderedReader.__new__(OrderedReader)
    r.sock = ours
    r.buf = bytearray(64)
    r.view = memoryview(r.buf)
    r.start = r.end = 0
    r.sid = b"3"
    r.where = "127.0.0.1:4222"
    r.info = {"max_payload": 1024}
    r.limit = frame_limit(r.info)
    r.next_dseq = 1
    r.last_sseq = 0
    r.pending_left = -1
    theirs.sendall(data)
    return r, theirs


def ack(stream_seq: int, dseq: int, pending: int) -> bytes:
    return b"$JS.ACK.S.C.1.%d.%d.1795000000000000000.%d" % (stream_seq, dseq, pending)


def frames(r: OrderedReader) -> list:
    out = []
    while r._fill(0.2):
        out += list(r._frames())
    return out


def test_msg_hmsg_ping_split_across_reads_and_a_growing_buffer() -> None:
    big = b"x" * 200  # larger than the 64-byte buffer: it must grow
    hdr = b"NATS/1.0\r\ntrace: t1\r\n\r\n"
    data = (
        b"MSG S.a 3 "
        + ack(1, 1, 2)
        + b" 5\r\nhello\r\nPING\r\n"
        + b"HMSG S.b 3 "
        + ack(2, 2, 1)
        + b" %d %d\r\n" % (len(hdr), len(hdr) + len(big))
        + hdr
        + big
        + b"\r\n"
        + b"MSG S.c 9 7\r\nignored\r\n"
    )
    r, peer = reader_with(data)
    got = frames(r)
    assert [f[0] for f in got] == [b"3", b"3", b"9"]
    batch, restart = r._take(iter(got))
    assert not restart
    assert [(x[0], x[2], x[4]) for x in batch] == [(1, b"S.a", b"hello"), (2, b"S.b", big)]
    assert batch[1][3] == (("trace", b"t1"),) and batch[0][1] == 1795000000000
    assert r.pending_left == 1
    peer.settimeout(1)
    assert peer.recv(100) == b"PONG\r\n"  # PING answered


def test_a_skipped_consumer_sequence_asks_for_a_restart() -> None:
    data = b"MSG S.a 3 " + ack(10, 1, 5) + b" 1\r\na\r\nMSG S.a 3 " + ack(12, 3, 3) + b" 1\r\nc\r\n"
    r, _ = reader_with(data)
    batch, restart = r._take(iter(frames(r)))
    assert restart and [x[0] for x in batch] == [10] and r.last_sseq == 10


def test_flow_control_and_stalled_heartbeat_are_answered() -> None:
    fc = b"NATS/1.0 100 FlowControl Request\r\n\r\n"
    hb = b"NATS/1.0 100 Idle Heartbeat\r\nNats-Consumer-Stalled: $JS.FC.S.C.x\r\n\r\n"
    data = (
        b"HMSG _INBOX.d 3 $JS.FC.S.C.1 %d %d\r\n" % (len(fc), len(fc))
        + fc
        + b"\r\n"
        + b"HMSG _INBOX.d 3 %d %d\r\n" % (len(hb), len(hb))
        + hb
        + b"\r\n"
    )
    r, peer = reader_with(data)
    batch, restart = r._take(iter(frames(r)))
    assert batch == [] and not restart
    peer.settimeout(1)
    sent = b""
    while sent.count(b"\r\n") < 4:
        sent += peer.recv(200)
    assert sent == b"PUB $JS.FC.S.C.1 0\r\n\r\nPUB $JS.FC.S.C.x 0\r\n\r\n"


@pytest.mark.parametrize(
    "data",
    [
        b"MSG S.a 3 x5\r\nhello\r\n",  # a byte count that is not a number
        b"HMSG S.a 3 9 5\r\nhello\r\n",  # headers longer than the frame
        b"MSG S.a 3 $JS.ACK.S.C.1.x.1.2.3 5\r\nhello\r\n",  # a delivery subject with garbage in it
        b"MSG S.a 3 $JS.ACK.S 5\r\nhello\r\n",  # too short to hold the sequences
    ],
)
def test_a_malformed_frame_is_a_protocol_violation(data: bytes) -> None:
    r, theirs = reader_with(data)
    try:
        with pytest.raises(ProtocolViolation, match=r"NATS at 127\.0\.0\.1:4222 broke the NATS protocol"):
            r._fill(0.2)
            r._take(r._frames())
    finally:
        theirs.close()
        r.sock.close()
