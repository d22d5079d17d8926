"""Device description for `rq doctor`: the reasons when nothing is there, and the attribute mapping."""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import pytest
from rdma_probe import device_listed

from transfer.rdma import devices, verbs
from transfer.rdma.conninfo import LINK_ETHERNET, LINK_INFINIBAND
from transfer.rdma.devices import RdmaGid, choose_gid_index, describe_devices
from transfer.rdma.errors import RdmaUnavailable


@pytest.mark.skipif(device_listed(), reason="this machine has an RDMA device")
def test_no_device_here_raises_unavailable_with_a_reason() -> None:
    with pytest.raises(RdmaUnavailable) as caught:
        describe_devices()
    reason = caught.value.reason
    assert reason
    assert any(word in reason for word in ("pyverbs", "no RDMA device", "kernel"))


def test_missing_pyverbs_is_said_plainly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verbs, "_MODULES", None)
    monkeypatch.setitem(sys.modules, "pyverbs", None)  # import pyverbs → ImportError
    with pytest.raises(RdmaUnavailable, match="pyverbs is not installed"):
        describe_devices()
    import transfer.rdma as rdma

    with pytest.raises(RdmaUnavailable, match="use --transport tcp or quic"):
        rdma.make_transport()


def test_attribute_names() -> None:
    assert devices.port_state(4) == "ACTIVE" and devices.port_state(1) == "DOWN"
    assert devices.port_state(42) == "state 42"
    assert devices.link_layer(1) == "InfiniBand" and devices.link_layer(2) == "Ethernet"
    assert devices.mtu_bytes(5) == 4096 and devices.mtu_bytes(1) == 256 and devices.mtu_bytes(9) == 0
    assert devices.guid_text(0x0002C90300A1B2C3) == "0002:c903:00a1:b2c3"


def test_gid_choice() -> None:
    link_local = RdmaGid(0, "fe80:0000:0000:0000:0250:56ff:fe00:0001", "IB/RoCE v1")
    link_local_v2 = RdmaGid(1, "fe80:0000:0000:0000:0250:56ff:fe00:0001", "RoCE v2")
    mapped_v1 = RdmaGid(2, "0000:0000:0000:0000:0000:ffff:0a00:0002", "IB/RoCE v1")
    mapped_v2 = RdmaGid(3, "0000:0000:0000:0000:0000:ffff:0a00:0002", "RoCE v2")
    assert choose_gid_index([link_local, link_local_v2, mapped_v1, mapped_v2], LINK_ETHERNET) == 3
    assert choose_gid_index([link_local, link_local_v2, mapped_v1], LINK_ETHERNET) == 1
    assert choose_gid_index([mapped_v1], LINK_ETHERNET) == 2
    assert choose_gid_index([link_local], LINK_INFINIBAND) == -1
    with pytest.raises(RdmaUnavailable, match="no GID"):
        choose_gid_index([], LINK_ETHERNET)


class _FakeError(Exception):
    pass


class _FakeContext:
    """Stands in for pyverbs.device.Context in a pure test of the mapping (two ports, one GID each)."""

    closed = False

    def __init__(self, name: str):
        self.name = name

    def query_device(self) -> Any:
        return SimpleNamespace(phys_port_cnt=2, node_guid=0x0002C90300A1B2C3)

    def query_port(self, port: int) -> Any:
        return SimpleNamespace(
            state=4 if port == 1 else 1, link_layer=2, active_mtu=3, max_mtu=5, lid=0, gid_tbl_len=3
        )

    def query_gid(self, port: int, index: int) -> Any:
        if index == 2:
            raise _FakeError("no such entry")
        text = (
            "0000:0000:0000:0000:0000:ffff:0a00:0002"
            if index == 1
            else "0000:0000:0000:0000:0000:0000:0000:0000"
        )
        return SimpleNamespace(gid=text)

    def query_gid_type(self, port: int, index: int) -> int:
        return 1

    def close(self) -> None:
        _FakeContext.closed = True


def test_describe_maps_ports_and_skips_empty_gids() -> None:
    v = SimpleNamespace(
        device=SimpleNamespace(Context=lambda name: _FakeContext(name)), PyverbsError=_FakeError
    )
    dev = devices._describe(v, "rxe0")
    assert dev.name == "rxe0" and dev.node_guid == "0002:c903:00a1:b2c3"
    assert [p.state for p in dev.ports] == ["ACTIVE", "DOWN"]
    port = dev.ports[0]
    assert (port.link_layer, port.active_mtu, port.max_mtu) == ("Ethernet", 1024, 4096)
    assert (port.num, port.mtu) == (1, 1024)  # the names rq doctor reads
    assert port.gids == (RdmaGid(1, "0000:0000:0000:0000:0000:ffff:0a00:0002", "RoCE v2"),)
    assert _FakeContext.closed
