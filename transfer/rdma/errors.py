"""RDMA's exceptions, placed inside the transfer library's hierarchy so callers need no RDMA knowledge.

A work completion that failed carries an `ibv_wc_status`; `completion_error` turns it into the error
the caller acts on: the peer went away (reconnect and resume), the peer refused an access (it is
misbehaving or confused about our buffers: a protocol error), or something broke locally.
"""

from __future__ import annotations

import enum

from transfer.errors import PeerUnreachableError, ProtocolError, TransferError, UnsupportedError


class RdmaUnavailable(UnsupportedError):
    """pyverbs is missing, or it works but there is no device or kernel support. `reason` says which."""

    def __init__(self, reason: str):
        super().__init__(f"RDMA unavailable: {reason}; use --transport tcp or quic")
        self.reason = reason


class ConnInfoError(ProtocolError):
    """The peer's connection info (QP number, GID, buffer geometry, keys) is garbled or unacceptable."""


class CreditError(ProtocolError):
    """The peer broke flow control: wrote into a slot it held no credit for, or returned credits it never had."""


class OutOfStepError(CreditError, ValueError):
    """A completion or a consumed slot that does not match what was posted or arrived: the queue
    pair's state is not what the pipe's counts say. A ProtocolError, so the pipe marks itself broken
    and the transfer tears the channel down as on any protocol error (also a ValueError, as these
    checks raised before)."""


class RdmaDeviceError(TransferError):
    """A verbs call failed locally (open, register, create, modify): the device or its limits said no."""


class WcStatus(enum.IntEnum):
    """`enum ibv_wc_status` from <infiniband/verbs.h>; the numbers are ABI and never change."""

    SUCCESS = 0
    LOC_LEN_ERR = 1
    LOC_QP_OP_ERR = 2
    LOC_EEC_OP_ERR = 3
    LOC_PROT_ERR = 4
    WR_FLUSH_ERR = 5
    MW_BIND_ERR = 6
    BAD_RESP_ERR = 7
    LOC_ACCESS_ERR = 8
    REM_INV_REQ_ERR = 9
    REM_ACCESS_ERR = 10
    REM_OP_ERR = 11
    RETRY_EXC_ERR = 12
    RNR_RETRY_EXC_ERR = 13
    LOC_RDD_VIOL_ERR = 14
    REM_INV_RD_REQ_ERR = 15
    REM_ABORT_ERR = 16
    INV_EECN_ERR = 17
    INV_EEC_STATE_ERR = 18
    FATAL_ERR = 19
    RESP_TIMEOUT_ERR = 20
    GENERAL_ERR = 21
    TM_ERR = 22
    TM_RNDV_INCOMPLETE = 23


class CompletionError(TransferError):
    """Base for a work completion with a status other than SUCCESS."""

    def __init__(self, status: int, wr_id: int, vendor_err: int, what: str):
        try:
            name = WcStatus(status).name
        except ValueError:
            name = f"status {status}"
        super().__init__(f"RDMA {what} failed: {name} (wr {wr_id}, vendor error {vendor_err:#x})")
        self.status = status
        self.wr_id = wr_id
        self.vendor_err = vendor_err


class PeerLostError(CompletionError, PeerUnreachableError):
    """The peer stopped answering (retries, RNR retries or response timer ran out; it aborted).
    Transient from the transfer's view: reconnect and resume."""


class FlushedError(CompletionError, PeerUnreachableError):
    """The queue pair went to the error state (an earlier failure, or teardown) and flushed this request."""


class RemoteAccessError(CompletionError, ProtocolError):
    """The peer's adapter refused the request: a bad key, address or length, or an invalid request.
    Our writes go only where the peer said; so the peer's info was wrong or it revoked the memory."""


class LocalCompletionError(CompletionError):
    """Our own request was malformed or our adapter failed: a bug or a device fault, not the peer."""


_PEER_LOST = {
    WcStatus.RETRY_EXC_ERR,
    WcStatus.RNR_RETRY_EXC_ERR,
    WcStatus.RESP_TIMEOUT_ERR,
    WcStatus.REM_ABORT_ERR,
}
_REMOTE = {
    WcStatus.REM_ACCESS_ERR,
    WcStatus.REM_INV_REQ_ERR,
    WcStatus.REM_OP_ERR,
    WcStatus.REM_INV_RD_REQ_ERR,
    WcStatus.BAD_RESP_ERR,
}


def completion_error(
    status: int, wr_id: int = 0, vendor_err: int = 0, what: str = "request"
) -> CompletionError:
    """The typed error for a failed work completion. Never call it with SUCCESS."""
    if status == WcStatus.SUCCESS:
        raise ValueError("a successful completion is not an error")
    if status in _PEER_LOST:
        return PeerLostError(status, wr_id, vendor_err, what)
    if status == WcStatus.WR_FLUSH_ERR:
        return FlushedError(status, wr_id, vendor_err, what)
    if status in _REMOTE:
        return RemoteAccessError(status, wr_id, vendor_err, what)
    return LocalCompletionError(status, wr_id, vendor_err, what)
