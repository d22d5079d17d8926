"""The only module that touches pyverbs, and only when asked: `import transfer.rdma` works without it.

`load()` imports pyverbs once. PyPI's pyverbs 59 is compiled against rdma-core v59, while Debian
bookworm ships libibverbs v44, which lacks the symbol versions v59 needs; scripts/setup-rdma.sh builds
the bundled v59 libraries into <venv>/opt/rdma-core, and `load()` maps those by absolute path before
the first pyverbs import, so the extension modules bind to them (the dynamic linker reuses an already
loaded library with the same soname) without LD_LIBRARY_PATH. RQ_RDMA_LIBDIR overrides the place.

`QueuePair` is one reliable-connected QP with its completion queue and three registered buffers:
the receive ring the peer writes into, the staging buffers our writes are copied into, and a tiny
scratch buffer for credit messages. It implements the `Port` the pipe (pipe.py) drives.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import secrets
import socket
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from transfer.rdma.conninfo import LINK_ETHERNET, LINK_INFINIBAND, ConnInfo, Ring
from transfer.rdma.errors import RdmaDeviceError, RdmaUnavailable
from transfer.rdma.pipe import Completion

_LOCK = threading.Lock()
PORT_ACTIVE = 4  # IBV_PORT_ACTIVE
_MODULES: Any = None
_LOADED_FROM: str = ""

SETUP_HINT = "scripts/setup-rdma.sh sets it up"


def _libdir() -> Path | None:
    env = os.environ.get("RQ_RDMA_LIBDIR")
    if env:
        return Path(env)
    for sub in ("lib", "lib64", "lib/x86_64-linux-gnu"):
        cand = Path(sys.prefix) / "opt" / "rdma-core" / sub
        if (cand / "libibverbs.so.1").exists():
            return cand
    return None


def _enums_module() -> Any:
    # rdma-core v59 calls it libibverbs_enums; Debian's v44 (python3-pyverbs) calls it enums.
    try:
        import pyverbs.libibverbs_enums as enums
    except ImportError:
        import pyverbs.enums as enums
    return enums


def load() -> Any:
    """The pyverbs modules rq uses, as one namespace; RdmaUnavailable says why not."""
    global _MODULES, _LOADED_FROM
    with _LOCK:
        if _MODULES is not None:
            return _MODULES
        try:
            import pyverbs  # noqa: F401  (is the package there at all?)
        except ImportError:
            raise RdmaUnavailable(
                f"pyverbs is not installed (pip install 'rqcli[rdma]'; {SETUP_HINT})"
            ) from None
        libdir = _libdir()
        if libdir is not None:
            for lib in ("libibverbs.so.1", "librdmacm.so.1"):
                path = libdir / lib
                if path.exists():
                    try:
                        ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
                    except OSError as exc:
                        raise RdmaUnavailable(f"cannot load {path}: {exc}") from None
        try:
            import pyverbs.addr as addr
            import pyverbs.cq as cq
            import pyverbs.device as device

            enums = _enums_module()
            import pyverbs.mr as mr
            import pyverbs.pd as pd
            import pyverbs.qp as qp
            import pyverbs.wr as wr
            from pyverbs.pyverbs_error import PyverbsError
        except ImportError as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise RdmaUnavailable(f"pyverbs does not load ({first}); {SETUP_HINT}") from None
        _MODULES = SimpleNamespace(
            addr=addr, cq=cq, device=device, e=enums, mr=mr, pd=pd, qp=qp, wr=wr, PyverbsError=PyverbsError
        )
        _LOADED_FROM = str(libdir) if libdir else "system libibverbs"
        return _MODULES


def describe_build() -> str:
    import importlib.metadata

    v = load()
    try:
        version = importlib.metadata.version("pyverbs")
    except importlib.metadata.PackageNotFoundError:
        version = "(Debian)"
    return f"pyverbs {version} with {_LOADED_FROM} ({Path(v.device.__file__).parent})"


# -- an opened device: context, protection domain, port attributes ------------------------------


@dataclass
class OpenDevice:
    name: str
    port: int
    gid_index: int
    ctx: Any
    pd: Any
    link_layer: int
    lid: int
    active_mtu: int
    gid: bytes


_DEVICES: dict[tuple[str, int, int], OpenDevice] = {}


def device_names() -> list[str]:
    v = load()
    try:
        return [
            d.name.decode() if isinstance(d.name, bytes) else str(d.name) for d in v.device.get_device_list()
        ]
    except v.PyverbsError as exc:
        # With no device (or no kernel support) libibverbs returns NULL and pyverbs raises.
        raise RdmaUnavailable(_no_device_reason(exc)) from None


def _no_device_reason(exc: BaseException | None = None) -> str:
    if not Path("/sys/class/infiniband").exists():
        return "no RDMA device (this kernel has no InfiniBand/RDMA support: /sys/class/infiniband is missing)"
    return "no RDMA device found (`ibv_devices` lists none; soft-RoCE: `rdma link add rxe0 type rxe netdev IFACE`)"


def open_device(name: str | None, port: int, gid_index: int | None) -> OpenDevice:
    """Opens (once per process) the named device, or the first one; picks a GID if none was given."""

    v = load()
    names = device_names()
    if not names:
        raise RdmaUnavailable(_no_device_reason())
    dev = name or names[0]
    if dev not in names:
        raise RdmaUnavailable(f"no RDMA device {dev!r} (have {', '.join(names)})")
    with _LOCK:
        try:
            ctx = v.device.Context(name=dev)
        except v.PyverbsError as exc:
            raise RdmaDeviceError(f"cannot open RDMA device {dev}: {exc}") from None
        try:
            return _open_port(v, ctx, dev, port, gid_index)
        except BaseException:
            with contextlib.suppress(Exception):
                ctx.close()
            raise


def _open_port(v: Any, ctx: Any, dev: str, port: int, gid_index: int | None) -> OpenDevice:
    from transfer.rdma.conninfo import gid_from_text
    from transfer.rdma.devices import choose_gid_index, port_state, read_gids

    try:
        pattr = ctx.query_port(port)
    except v.PyverbsError:
        raise RdmaUnavailable(f"RDMA device {dev} has no port {port} (see `rq doctor`)") from None
    if int(pattr.state) != PORT_ACTIVE:
        raise RdmaUnavailable(f"RDMA device {dev} port {port} is {port_state(int(pattr.state))}, not ACTIVE")
    link = LINK_ETHERNET if pattr.link_layer == v.e.IBV_LINK_LAYER_ETHERNET else LINK_INFINIBAND
    if gid_index is None:
        gid_index = choose_gid_index(read_gids(v, ctx, port, pattr.gid_tbl_len), link)
    key = (dev, port, gid_index)
    if key in _DEVICES:
        ctx.close()
        return _DEVICES[key]
    try:
        gid = gid_from_text(ctx.query_gid(port, gid_index).gid) if gid_index >= 0 else bytes(16)
    except v.PyverbsError:
        raise RdmaUnavailable(f"RDMA device {dev} port {port} has no GID index {gid_index}") from None
    if link == LINK_ETHERNET and gid == bytes(16):
        raise RdmaUnavailable(
            f"GID index {gid_index} of {dev} port {port} is empty; pick one `rq doctor` lists"
        )
    try:
        pd = v.pd.PD(ctx)
    except v.PyverbsError as exc:
        raise RdmaDeviceError(f"cannot allocate a protection domain on {dev}: {exc}") from None
    opened = OpenDevice(dev, port, gid_index, ctx, pd, link, pattr.lid, pattr.active_mtu, gid)
    _DEVICES[key] = opened
    return opened


# -- one queue pair with its buffers -------------------------------------------------------------


class _Buffer:
    """Anonymous memory registered with the adapter; a memoryview for Python, an address for verbs."""

    def __init__(self, v: Any, pd: Any, length: int, access: int):
        self.map = mmap.mmap(-1, length)
        self._anchor = ctypes.c_char.from_buffer(self.map)
        self.addr = ctypes.addressof(self._anchor)
        self.view = memoryview(self.map)
        self.mr = v.mr.MR(pd, length, access, address=self.addr)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.mr.close()
        self.view.release()
        del self._anchor
        with contextlib.suppress(BufferError):  # a stray slice still alive: the GC unmaps it later
            self.map.close()


class QueuePair:
    """An RC queue pair, its CQ and buffers; the `Port` pipe.Pipe drives. Not thread-safe by itself."""

    SCRATCH = 64

    def __init__(
        self,
        dev: OpenDevice,
        ring_slots: int,
        ring_slot_size: int,
        staging: int,
        staging_size: int,
        recv_depth: int,
    ):
        v = self.v = load()
        e = v.e
        self.dev = dev
        self.ring_slot_size = ring_slot_size
        self.staging_size = staging_size
        self._bufs: list[_Buffer] = []
        self.qp: Any = None
        self.cq: Any = None
        try:
            self.cq = v.cq.CQ(dev.ctx, recv_depth + staging + 64)
            self.ring = self._buffer(
                ring_slots * ring_slot_size, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
            )
            self.stage = self._buffer(staging * staging_size, e.IBV_ACCESS_LOCAL_WRITE)
            self.scratch = self._buffer(self.SCRATCH, e.IBV_ACCESS_LOCAL_WRITE)
            cap = v.qp.QPCap(max_send_wr=staging + 40, max_recv_wr=recv_depth, max_send_sge=1, max_recv_sge=1)
            init = v.qp.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap, sq_sig_all=0)
            attr = v.qp.QPAttr(port_num=dev.port)
            attr.qp_access_flags = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
            self.qp = v.qp.QP(dev.pd, init, attr)  # created and moved to INIT
        except (v.PyverbsError, OSError, ValueError) as exc:  # verbs said no, or memory could not be mapped
            self.close()
            raise RdmaDeviceError(f"cannot set up an RDMA queue pair on {dev.name}: {exc}") from None
        self.psn = secrets.randbelow(1 << 24)
        self.ring_slots = ring_slots
        self.peer: ConnInfo | None = None

    def _buffer(self, length: int, access: int) -> _Buffer:
        buf = _Buffer(self.v, self.dev.pd, length, access)
        self._bufs.append(buf)
        return buf

    def local_info(self) -> ConnInfo:
        d = self.dev
        ring = Ring(self.ring.addr, self.ring.mr.rkey, self.ring_slot_size, self.ring_slots)
        global_route = d.gid_index >= 0  # -1: InfiniBand routed by LID alone
        return ConnInfo(self.qp.qp_num, self.psn, d.lid, d.port, max(d.gid_index, 0), d.gid, d.link_layer,
                        d.active_mtu, ring, global_route)  # fmt: skip

    def connect(self, peer: ConnInfo, mtu: int) -> None:
        """INIT → RTR → RTS towards the peer; our receives must already be posted."""
        attr = rts_attr(self.v, self.dev.port, self.dev.gid_index, peer, self.psn, mtu)
        try:
            self.qp.to_rts(attr)
        except self.v.PyverbsError as exc:
            raise RdmaDeviceError(f"cannot connect the queue pair: {exc}") from None
        self.peer = peer

    # -- Port ----------------------------------------------------------------------------------

    def staging(self, index: int) -> memoryview:
        return self.stage.view[index * self.staging_size : (index + 1) * self.staging_size]

    def ring_slot(self, slot: int) -> memoryview:
        return self.ring.view[slot * self.ring_slot_size : (slot + 1) * self.ring_slot_size]

    def post_write(self, staging: int, length: int, slot: int, imm: int, wr_id: int) -> None:
        assert self.peer is not None
        addr = self.stage.addr + staging * self.staging_size
        self._post_send(write_wr(self.v, wr_id, addr, length, self.stage.mr.lkey, self.peer.ring, slot, imm))

    def post_credit(self, cumulative: int, wr_id: int) -> None:
        self._post_send(credit_wr(self.v, wr_id, self.scratch.addr, self.scratch.mr.lkey, cumulative))

    def _post_send(self, wr: Any) -> None:
        try:
            self.qp.post_send(wr)
        except self.v.PyverbsError as exc:
            raise RdmaDeviceError(f"posting an RDMA send failed: {exc}") from None

    def post_recv(self, wr_id: int) -> None:
        v = self.v
        try:
            self.qp.post_recv(recv_wr(v, wr_id, self.scratch.addr + 32, 32, self.scratch.mr.lkey))
        except v.PyverbsError as exc:
            raise RdmaDeviceError(f"posting an RDMA receive failed: {exc}") from None

    def poll(self, max_entries: int) -> list[Completion]:
        e = self.v.e
        _, wcs = self.cq.poll(max_entries)
        out = []
        for wc in wcs:
            # On an error completion only wr_id, status and vendor_err are defined (not opcode):
            # the kind of request is therefore encoded in wr_id (pipe.WrKind).
            out.append(
                Completion(
                    wr_id=wc.wr_id,
                    status=wc.status,
                    vendor_err=wc.vendor_err,
                    byte_len=wc.byte_len,
                    imm=socket.ntohl(wc.imm_data) if wc.status == 0 else 0,
                    data_write=wc.status == 0 and wc.opcode == e.IBV_WC_RECV_RDMA_WITH_IMM,
                )
            )
        return out

    def close(self) -> None:
        """Error state first (flushes whatever is outstanding), then QP, buffers, CQ; idempotent."""
        v = self.v
        if self.qp is not None:
            with contextlib.suppress(Exception):
                attr = v.qp.QPAttr()
                attr.qp_state = v.e.IBV_QPS_ERR
                self.qp.modify(attr, v.e.IBV_QP_STATE)
            with contextlib.suppress(Exception):
                if self.cq is not None:
                    self.cq.poll(1024)
            with contextlib.suppress(Exception):
                self.qp.close()
            self.qp = None
        for buf in self._bufs:
            buf.close()
        self._bufs.clear()
        if self.cq is not None:
            with contextlib.suppress(Exception):
                self.cq.close()
            self.cq = None


# -- work requests and QP attributes (pure pyverbs structs: built and checked without a device) ----


def write_wr(v: Any, wr_id: int, addr: int, length: int, lkey: int, ring: Ring, slot: int, imm: int) -> Any:
    """RDMA WRITE WITH IMMEDIATE of one staging buffer into one slot of the peer's ring, signalled."""
    e = v.e
    sge = v.wr.SGE(addr, length, lkey)
    # imm_data is big-endian on the wire (__be32); pyverbs passes the integer through unchanged.
    wr = v.wr.SendWR(wr_id=wr_id, opcode=e.IBV_WR_RDMA_WRITE_WITH_IMM, num_sge=1, sg=[sge],
                     imm_data=socket.htonl(imm), send_flags=e.IBV_SEND_SIGNALED)  # fmt: skip
    wr.set_wr_rdma(ring.rkey, ring.slot_addr(slot))
    return wr


def credit_wr(v: Any, wr_id: int, addr: int, lkey: int, cumulative: int) -> Any:
    """SEND WITH IMMEDIATE carrying a cumulative credit count (pyverbs wants one SGE: 4 scratch bytes)."""
    e = v.e
    sge = v.wr.SGE(addr, 4, lkey)
    return v.wr.SendWR(wr_id=wr_id, opcode=e.IBV_WR_SEND_WITH_IMM, num_sge=1, sg=[sge],
                       imm_data=socket.htonl(cumulative), send_flags=e.IBV_SEND_SIGNALED)  # fmt: skip


def recv_wr(v: Any, wr_id: int, addr: int, length: int, lkey: int) -> Any:
    return v.wr.RecvWR(wr_id=wr_id, num_sge=1, sg=[v.wr.SGE(addr, length, lkey)])


def rts_attr(v: Any, port: int, gid_index: int, peer: ConnInfo, psn: int, mtu: int) -> Any:
    """Everything INIT→RTR→RTS needs for an RC QP towards `peer` (pyverbs' to_rts masks)."""
    e = v.e
    attr = v.qp.QPAttr(port_num=port, path_mtu=mtu)
    attr.dest_qp_num = peer.qp_num
    attr.rq_psn = peer.psn
    attr.sq_psn = psn
    attr.max_dest_rd_atomic = 1
    attr.max_rd_atomic = 1
    attr.min_rnr_timer = 12  # 0.64 ms
    attr.timeout = 14  # 4.096 µs · 2^14 ≈ 67 ms per try
    attr.retry_cnt = 7
    attr.rnr_retry = 7  # "infinite": a reader briefly out of receives is not an error
    attr.qp_access_flags = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
    if peer.global_route:
        gid = v.addr.GID(peer.gid_text)
        gr = v.addr.GlobalRoute(dgid=gid, sgid_index=max(gid_index, 0), hop_limit=64)
        attr.ah_attr = v.addr.AHAttr(port_num=port, is_global=1, gr=gr, dlid=peer.lid)
    else:
        attr.ah_attr = v.addr.AHAttr(port_num=port, is_global=0, dlid=peer.lid)
    return attr
