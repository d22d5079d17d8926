"""`--datagram-size` is a ceiling with qh3 too. qh3 probes the path MTU upward from its
max_datagram_size (client side): with `--datagram-size 1200` the sender sent 1472-byte datagrams,
and on a 1300-MTU veth each went out in two IP fragments once rq lets datagrams fragment after
the handshake (QUIC review). rq now turns qh3's probing off (it picks the size itself). The test
watches the loopback device (AF_PACKET: root) during a real transfer."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import threading
from pathlib import Path

import pytest
from xfer_kit import Recv, rq_cmd, rq_env

pytestmark = pytest.mark.integration
pytest.importorskip("qh3")


class _Sniffer(threading.Thread):
    """The largest UDP payload sent to `port` on lo while it runs."""

    def __init__(self, port: int):
        super().__init__(daemon=True)
        self.port, self.largest, self.seen = port, 0, 0
        self.done = threading.Event()
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(0x0003))
        self.sock.bind(("lo", 0))
        self.sock.settimeout(0.2)

    def run(self) -> None:
        while not self.done.is_set():
            try:
                pkt, addr = self.sock.recvfrom(70000)
            except TimeoutError:
                continue
            ip = pkt[14:]
            if addr[2] == socket.PACKET_OUTGOING or ip[0] >> 4 != 4 or ip[9] != 17:
                continue
            ihl = (ip[0] & 15) * 4
            _sport, dport, length = struct.unpack("!HHH", ip[ihl : ihl + 6])
            if dport == self.port:
                self.seen += 1
                self.largest = max(self.largest, length - 8)


def test_qh3_keeps_to_the_datagram_size_it_is_given(tmp_path: Path) -> None:
    try:
        socket.socket(socket.AF_PACKET, socket.SOCK_RAW).close()
    except PermissionError:
        pytest.skip("watching lo needs root (AF_PACKET)")
    src = tmp_path / "m.bin"
    src.write_bytes(os.urandom(2 << 20))
    recv = Recv(tmp_path / "dst", tmp_path / "cert", "quic", "--quic-backend", "qh3", "--once").start()
    sniffer = _Sniffer(recv.port)
    sniffer.start()
    try:
        cmd = rq_cmd(
            "send", str(src), recv.url, *recv.send_args(), "--quic-backend", "qh3", "--datagram-size", "1200"
        )
        r = subprocess.run(cmd, env=rq_env(), capture_output=True, timeout=120)
        assert r.returncode == 0, r.stderr.decode()
    finally:
        sniffer.done.set()
        sniffer.join(10)
        recv.stop()
    assert (tmp_path / "dst" / "m.bin").read_bytes() == src.read_bytes()
    assert sniffer.seen > 100
    assert sniffer.largest <= 1200, sniffer.largest  # was 1472
