"""Work-completion status → typed errors the transfer library and the CLI act on."""

from __future__ import annotations

import pytest

from transfer.errors import PeerUnreachableError, ProtocolError, TransferError, UnsupportedError
from transfer.rdma.errors import (
    CompletionError,
    FlushedError,
    LocalCompletionError,
    PeerLostError,
    RdmaUnavailable,
    RemoteAccessError,
    WcStatus,
    completion_error,
)

EXPECTED = {
    WcStatus.RETRY_EXC_ERR: PeerLostError,
    WcStatus.RNR_RETRY_EXC_ERR: PeerLostError,
    WcStatus.RESP_TIMEOUT_ERR: PeerLostError,
    WcStatus.REM_ABORT_ERR: PeerLostError,
    WcStatus.WR_FLUSH_ERR: FlushedError,
    WcStatus.REM_ACCESS_ERR: RemoteAccessError,
    WcStatus.REM_INV_REQ_ERR: RemoteAccessError,
    WcStatus.REM_OP_ERR: RemoteAccessError,
    WcStatus.REM_INV_RD_REQ_ERR: RemoteAccessError,
    WcStatus.BAD_RESP_ERR: RemoteAccessError,
    WcStatus.LOC_LEN_ERR: LocalCompletionError,
    WcStatus.LOC_QP_OP_ERR: LocalCompletionError,
    WcStatus.LOC_PROT_ERR: LocalCompletionError,
    WcStatus.LOC_ACCESS_ERR: LocalCompletionError,
    WcStatus.MW_BIND_ERR: LocalCompletionError,
    WcStatus.FATAL_ERR: LocalCompletionError,
    WcStatus.GENERAL_ERR: LocalCompletionError,
}


@pytest.mark.parametrize("status", [s for s in WcStatus if s != WcStatus.SUCCESS])
def test_every_failure_status_maps_to_a_completion_error(status: WcStatus) -> None:
    err = completion_error(int(status), wr_id=5, vendor_err=0x12, what="write")
    assert isinstance(err, CompletionError) and isinstance(err, TransferError)
    assert err.status == status and err.wr_id == 5
    assert status.name in str(err) and "write" in str(err) and "0x12" in str(err)
    if status in EXPECTED:
        assert type(err) is EXPECTED[status]


def test_transient_errors_are_retryable_and_peer_faults_are_protocol_errors() -> None:
    assert isinstance(completion_error(WcStatus.RETRY_EXC_ERR), PeerUnreachableError)
    assert isinstance(completion_error(WcStatus.WR_FLUSH_ERR), PeerUnreachableError)
    assert isinstance(completion_error(WcStatus.REM_ACCESS_ERR), ProtocolError)
    local = completion_error(WcStatus.LOC_PROT_ERR)
    assert not isinstance(local, PeerUnreachableError | ProtocolError)


def test_unknown_status_still_maps() -> None:
    err = completion_error(99)
    assert isinstance(err, LocalCompletionError) and "status 99" in str(err)


def test_success_is_not_an_error() -> None:
    with pytest.raises(ValueError):
        completion_error(0)


def test_unavailable_is_unsupported_and_names_the_alternative() -> None:
    err = RdmaUnavailable("pyverbs is not installed")
    assert isinstance(err, UnsupportedError)
    assert err.reason == "pyverbs is not installed"
    assert "--transport tcp or quic" in str(err)
