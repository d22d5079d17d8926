"""RDMA transport for rq send/recv (pyverbs): imports without pyverbs; `make_transport` checks for it.

RDMA has no encryption: use it only on a trusted fabric (docs/rdma.md).
"""

from __future__ import annotations

from transfer.rdma.errors import RdmaUnavailable

__all__ = ["RdmaUnavailable", "make_transport"]


def make_transport() -> object:
    """The RDMA driver, or RdmaUnavailable at once (no pyverbs, no device, no kernel support)."""
    from transfer.rdma import verbs
    from transfer.rdma.driver import RdmaTransport

    verbs.load()
    if not verbs.device_names():
        raise RdmaUnavailable("no RDMA device found (`ibv_devices` lists none)")
    return RdmaTransport()
