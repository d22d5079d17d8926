"""What RDMA hardware this machine has, for `rq doctor` and for picking a default GID.

    describe_devices() -> list[RdmaDevice]      # or raises RdmaUnavailable(reason)

The reason says which of three things is missing: pyverbs (or its libraries), kernel support, or a
device. pyverbs' get_device_list() raises instead of returning [] when there is none; that is
turned into the plain reason here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from transfer.rdma.conninfo import LINK_ETHERNET, MTU_BYTES
from transfer.rdma.errors import RdmaUnavailable

PORT_STATES = {0: "NOP", 1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
LINK_LAYERS = {0: "unspecified", 1: "InfiniBand", 2: "Ethernet"}
GID_TYPES = {0: "IB/RoCE v1", 1: "RoCE v2"}  # enum ibv_gid_type_sysfs
MAX_GIDS_SHOWN = 16


@dataclass(frozen=True)
class RdmaGid:
    index: int
    gid: str  # eight groups of four hex digits, as pyverbs and `ibv_devinfo -v` show it
    type: str | None  # "IB/RoCE v1", "RoCE v2", or None where the kernel would not say


@dataclass(frozen=True)
class RdmaPort:
    number: int
    state: str  # ACTIVE, DOWN, INIT, …
    link_layer: str  # InfiniBand, Ethernet
    active_mtu: int  # bytes
    max_mtu: int  # bytes
    lid: int
    gids: tuple[RdmaGid, ...]

    @property
    def num(self) -> int:  # the short names rq doctor uses
        return self.number

    @property
    def mtu(self) -> int:
        return self.active_mtu


@dataclass(frozen=True)
class RdmaDevice:
    name: str
    node_guid: str
    ports: tuple[RdmaPort, ...]


def port_state(code: int) -> str:
    return PORT_STATES.get(code, f"state {code}")


def link_layer(code: int) -> str:
    return LINK_LAYERS.get(code, f"link layer {code}")


def mtu_bytes(code: int) -> int:
    return MTU_BYTES.get(code, 0)


def guid_text(guid: int) -> str:
    h = f"{guid:016x}"
    return ":".join(h[i : i + 4] for i in range(0, 16, 4))


def read_gids(v: Any, ctx: Any, port: int, table_len: int) -> list[RdmaGid]:
    """The non-empty entries of a port's GID table (a zero GID is an unused entry)."""
    gids = []
    for index in range(table_len):
        try:
            text = str(ctx.query_gid(port, index).gid)
        except v.PyverbsError:
            continue
        if text.replace(":", "").strip("0") == "":
            continue
        try:
            gtype: str | None = GID_TYPES.get(int(ctx.query_gid_type(port, index)))
        except Exception:  # older kernels and IB ports may not say; the GID is still usable
            gtype = None
        gids.append(RdmaGid(index, text, gtype))
    return gids


def choose_gid_index(gids: list[RdmaGid], link: int) -> int:
    """The GID to route by when the user gave none. On RoCE: a RoCE v2 GID (routable over IP),
    preferring an IPv4-mapped one; on InfiniBand: -1 (route by LID, no GRH) unless only GIDs exist."""
    if link != LINK_ETHERNET:
        return -1
    v2 = [g for g in gids if g.type == "RoCE v2"]
    mapped = [g for g in v2 if g.gid.startswith("0000:0000:0000:0000:0000:ffff:")]
    for pick in (mapped, v2, gids):
        if pick:
            return pick[0].index
    raise RdmaUnavailable("the RoCE port has no GID (is the interface up with an address?)")


def describe_devices() -> list[RdmaDevice]:
    """Every RDMA device with its ports; RdmaUnavailable(reason) if pyverbs, kernel support or a device is missing."""
    from transfer.rdma import verbs

    v = verbs.load()
    names = verbs.device_names()
    if not names:
        raise RdmaUnavailable("no RDMA device found (`ibv_devices` lists none)")
    return [_describe(v, name) for name in names]


def _describe(v: Any, name: str) -> RdmaDevice:
    try:
        ctx = v.device.Context(name=name)
    except v.PyverbsError as exc:
        raise RdmaUnavailable(f"cannot open RDMA device {name}: {exc}") from None
    try:
        attr = ctx.query_device()
        ports = []
        for number in range(1, int(attr.phys_port_cnt) + 1):
            p = ctx.query_port(number)
            gids = read_gids(v, ctx, number, int(p.gid_tbl_len))[:MAX_GIDS_SHOWN]
            ports.append(
                RdmaPort(
                    number=number,
                    state=port_state(int(p.state)),
                    link_layer=link_layer(int(p.link_layer)),
                    active_mtu=mtu_bytes(int(p.active_mtu)),
                    max_mtu=mtu_bytes(int(p.max_mtu)),
                    lid=int(p.lid),
                    gids=tuple(gids),
                )
            )
        return RdmaDevice(name=name, node_guid=guid_text(int(attr.node_guid)), ports=tuple(ports))
    finally:
        ctx.close()
