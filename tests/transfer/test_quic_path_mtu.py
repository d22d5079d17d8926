"""A path narrower than the sender's link, with no ICMP to say so (a path-MTU black hole).

The sender's end of a veth pair has MTU 9000, the receiver's 1500: veth drops every frame larger
than the receiving end's MTU without a word. aioquic sends at the route's datagram size (8972
bytes here) and never probes the path, so every datagram of its handshake was lost and the send
ended with exit 6, re-run after re-run. The sender now tries again at QUIC's minimum (1200 bytes)
once the first try heard nothing, and says so once."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from rqtest import VethLink, popen_rq_with, veth_namespace, wait_or_fail
from xfer_kit import quic_recv_in_namespace, rq_env

pytestmark = [pytest.mark.integration, pytest.mark.netns]


@pytest.fixture
def narrow_path() -> Iterator[VethLink]:
    with veth_namespace("rqmtu") as link:
        subprocess.run(["ip", "link", "set", link.outer, "mtu", "9000"], check=True, capture_output=True)
        inside = ["ip", "netns", "exec", link.ns]
        subprocess.run(
            [*inside, "ip", "link", "set", link.inner, "mtu", "1500"], check=True, capture_output=True
        )
        yield link


def test_aioquic_falls_back_to_small_datagrams_through_a_black_hole(
    tmp_path: Path, narrow_path: VethLink
) -> None:
    src = tmp_path / "model.bin"
    src.write_bytes(os.urandom(256 * 1024))
    recv = quic_recv_in_namespace(tmp_path, narrow_path.ns, narrow_path.there, "aioquic")
    try:
        send = popen_rq_with(
            "import transfer.quic as q; q.PROBE_FOR = 0.3",
            "send",
            str(src),
            recv.url,
            *recv.send_args(),
            "--quic-backend",
            "aioquic",
            "--json",
            "--timeout",
            "3",
            "--retry-for",
            "3",
            env=rq_env(),
        )
        rc = wait_or_fail(send, 30, "rq send still running")
        out, err = send.communicate()
    finally:
        recv.stop()
    assert rc == 0, err.decode()
    lines = [json.loads(x) for x in out.decode().splitlines() if x.strip()]
    narrowed = [x for x in lines if x.get("event") == "datagram_size"]
    assert narrowed == [{"event": "datagram_size", "datagram_size": 1200, "tried": 8972}]
    assert (tmp_path / "dst" / "model.bin").read_bytes() == src.read_bytes()
    # told once, with the option that sets it
    assert err.decode().count("--datagram-size") == 1, err.decode()
