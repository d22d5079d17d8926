"""What two peers tell each other to connect a reliable-connected queue pair, and how it is checked.

Sent once each way over the bootstrap connection (TLS, certificate pinned, after the core's token
check), so it is authentic; it is still validated field by field, because a confused or hostile peer
that knows the token must not make us build a queue pair towards nonsense or write outside the
buffer it offered. Fixed-size binary, big-endian (docs/rdma.md):

    magic "RQRD" | version u8 | flags u8 | link layer u8 | mtu u8 | qp number u32 | psn u32
    | lid u16 | port u8 | gid index u8 | gid 16 bytes | ring address u64 | ring rkey u32
    | slot size u32 | slot count u32
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

from transfer.rdma.errors import ConnInfoError

MAGIC = b"RQRD"
VERSION = 1
FORMAT = struct.Struct("!4sBBBBIIHBB16sQIII")
SIZE = FORMAT.size

FLAG_GLOBAL = 0x01  # route with a GRH (dest GID); always on RoCE, optional on InfiniBand
KNOWN_FLAGS = FLAG_GLOBAL

LINK_INFINIBAND = 1  # IBV_LINK_LAYER_INFINIBAND
LINK_ETHERNET = 2  # IBV_LINK_LAYER_ETHERNET (RoCE)

MTU_BYTES = {1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096}  # enum ibv_mtu → bytes

MIN_SLOT = 4096
MAX_SLOT = 64 * 1024 * 1024
MAX_SLOTS = 4096  # slot numbers must fit the 16 bits of the immediate
MAX_RING = 1024 * 1024 * 1024  # a peer may not ask us to track more than this much of its memory
QPN_LIMIT = 1 << 24
MAX_UNICAST_LID = 0xBFFF


@dataclass(frozen=True)
class Ring:
    """The receive buffer a side offers: `count` slots of `slot_size` bytes from `addr`, under `rkey`."""

    addr: int
    rkey: int
    slot_size: int
    count: int

    @property
    def length(self) -> int:
        return self.slot_size * self.count

    def slot_addr(self, slot: int) -> int:
        if not 0 <= slot < self.count:
            raise IndexError(f"slot {slot} outside a ring of {self.count}")
        return self.addr + slot * self.slot_size


@dataclass(frozen=True)
class ConnInfo:
    qp_num: int
    psn: int
    lid: int
    port: int
    gid_index: int
    gid: bytes  # 16 raw bytes
    link_layer: int
    mtu: int  # enum ibv_mtu (1..5)
    ring: Ring
    global_route: bool = True

    def encode(self) -> bytes:
        flags = FLAG_GLOBAL if self.global_route else 0
        r = self.ring
        return FORMAT.pack(
            MAGIC, VERSION, flags, self.link_layer, self.mtu, self.qp_num, self.psn, self.lid, self.port,
            self.gid_index, self.gid, r.addr, r.rkey, r.slot_size, r.count,
        )  # fmt: skip

    @property
    def gid_text(self) -> str:
        """The GID as pyverbs writes it: eight groups of four hex digits."""
        h = self.gid.hex()
        return ":".join(h[i : i + 4] for i in range(0, 32, 4))


def gid_from_text(text: str) -> bytes:
    """pyverbs' 'xxxx:…:xxxx' (or any IPv6 spelling) → 16 raw bytes."""
    try:
        return ipaddress.IPv6Address(text.strip()).packed
    except ValueError:
        raise ConnInfoError(f"not a GID: {text!r}") from None


def decode(data: bytes | bytearray | memoryview) -> ConnInfo:
    """Parses and checks a peer's connection info on its own terms; `check_compatible` does the rest."""
    if len(data) != SIZE:
        raise ConnInfoError(f"connection info is {len(data)} bytes, expected {SIZE}")
    (magic, version, flags, link, mtu, qpn, psn, lid, port, gid_index, gid, addr, rkey, slot_size, count) = (
        FORMAT.unpack(bytes(data))
    )
    if magic != MAGIC:
        raise ConnInfoError("not rq RDMA connection info (bad magic)")
    if version != VERSION:
        raise ConnInfoError(f"peer speaks RDMA setup version {version}, this rq speaks {VERSION}")
    if flags & ~KNOWN_FLAGS:
        raise ConnInfoError(f"unknown flags {flags:#x}")
    if link not in (LINK_INFINIBAND, LINK_ETHERNET):
        raise ConnInfoError(f"unknown link layer {link}")
    if mtu not in MTU_BYTES:
        raise ConnInfoError(f"invalid path MTU code {mtu}")
    if not 2 <= qpn < QPN_LIMIT:  # 0 and 1 are the management QPs, never a peer's RC QP
        raise ConnInfoError(f"invalid queue pair number {qpn}")
    if psn >= QPN_LIMIT:
        raise ConnInfoError(f"packet sequence number {psn} is wider than 24 bits")
    if port < 1:
        raise ConnInfoError("port numbers start at 1")
    global_route = bool(flags & FLAG_GLOBAL)
    if link == LINK_ETHERNET and not global_route:
        raise ConnInfoError("RoCE needs a global route (GID)")
    if global_route:
        _check_gid(gid)
    elif not 1 <= lid <= MAX_UNICAST_LID:
        raise ConnInfoError(f"invalid unicast LID {lid:#x} (and no GID to route by)")
    ring = Ring(addr, rkey, slot_size, count)
    _check_ring(ring)
    return ConnInfo(qpn, psn, lid, port, gid_index, gid, link, mtu, ring, global_route)


def _check_gid(gid: bytes) -> None:
    if gid == bytes(16):
        raise ConnInfoError("GID is all zeros")
    if gid[0] == 0xFF:
        raise ConnInfoError("GID is a multicast address")


def _check_ring(ring: Ring) -> None:
    if not MIN_SLOT <= ring.slot_size <= MAX_SLOT:
        raise ConnInfoError(f"slot size {ring.slot_size} outside {MIN_SLOT}..{MAX_SLOT}")
    if ring.slot_size % 64:
        raise ConnInfoError(f"slot size {ring.slot_size} is not a multiple of 64")
    if not 1 <= ring.count <= MAX_SLOTS:
        raise ConnInfoError(f"slot count {ring.count} outside 1..{MAX_SLOTS}")
    if ring.length > MAX_RING:
        raise ConnInfoError(f"ring of {ring.length} bytes is over the {MAX_RING} allowed")
    if ring.addr == 0:
        raise ConnInfoError("ring address is null")
    if ring.addr + ring.length > 1 << 64:
        raise ConnInfoError("ring wraps past the end of the address space")


def check_compatible(local: ConnInfo, peer: ConnInfo) -> int:
    """Can our QP reach the peer's? Returns the path MTU code both can use."""
    if local.link_layer != peer.link_layer:
        raise ConnInfoError(
            f"link layers differ: ours is {_link_name(local.link_layer)}, the peer's {_link_name(peer.link_layer)}"
        )
    if local.link_layer == LINK_INFINIBAND and local.global_route != peer.global_route:
        raise ConnInfoError("one side routes by GID and the other by LID; pass the same --gid-index to both")
    return min(local.mtu, peer.mtu)


def _link_name(code: int) -> str:
    return {LINK_INFINIBAND: "InfiniBand", LINK_ETHERNET: "Ethernet (RoCE)"}.get(code, str(code))
