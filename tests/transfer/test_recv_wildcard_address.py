"""`rq recv --listen 0.0.0.0:PORT` prints a `rq send` line with an address of this machine that the
sender can reach. It printed socket.gethostname(), which on Debian-style hosts resolves to
127.0.1.1: the pasted line sent to the sender's own machine."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
from rqtest import veth_namespace
from xfer_kit import Recv

from transfer.hostaddr import reachable_address


@pytest.mark.integration
@pytest.mark.netns
def test_wildcard_listener_prints_the_interface_address(tmp_path: Path) -> None:
    # a namespace with one veth address and no default route: the interface address it is
    with veth_namespace("rqwild") as link:
        recv = Recv(
            tmp_path / "dst", tmp_path / "cert", "tcp", "--once", netns=link.ns, host="0.0.0.0"
        ).start()
        try:
            line = recv.info["send"]
        finally:
            recv.stop()
    assert f"rq://{link.there}:{recv.port} " in line, line


def test_reachable_address_is_never_loopback() -> None:
    shown = reachable_address("0.0.0.0")
    try:
        ip = ipaddress.ip_address(shown)
    except ValueError:
        return  # no address at all: the host name is the last resort
    assert not ip.is_loopback and not ip.is_unspecified, shown
