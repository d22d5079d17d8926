"""The transfer library's exceptions: one small hierarchy, each kind named for what the caller does about it.

The `code` of each class is the short string the receiver puts in an ERROR frame, so a refusal on one
side surfaces as the same exception type on the other.
"""

from __future__ import annotations


class TransferError(Exception):
    """Base of everything this library raises on purpose."""

    code = "failure"


class ProtocolError(TransferError):
    """The peer sent something that does not follow docs/protocol.md (bad frame, wrong order, bad sizes)."""

    code = "protocol"


class UnsafeNameError(ProtocolError):
    """A file name from the network would escape, or is not allowed inside, the destination."""

    code = "unsafe-name"


class NameTooLongError(UnsafeNameError):
    """A name longer than the protocol carries (names.MAX_NAME_BYTES): refused by the receiver, and
    by the sender's scan before anything is sent (a tree sent without it would be incomplete)."""


class LimitError(ProtocolError):
    """The manifest asks for more than the receiver allows (--max-bytes, file or chunk caps)."""

    code = "limit"


class AuthError(TransferError):
    """Wrong or missing token, or the certificate did not match the pinned fingerprint."""

    code = "auth"


class UnsafeSecretError(AuthError):
    """A token file, key or certificate directory another user could read or have put there
    (ssh's StrictModes): refused before anything listens or is sent. Its message says the fix."""


class VerifyError(TransferError):
    """A digest did not match: data is corrupt, or the source changed while it was read."""

    code = "verify"


class SourceChangedError(VerifyError):
    """A source file changed while it was being sent; re-run to send the new version."""

    code = "changed"


class SourceUnreadableError(SourceChangedError):
    """A SOURCE cannot be sent as asked: not a regular file or directory (a FIFO, a device), a
    directory that cannot be listed, a file that cannot be read. No re-run helps until it is fixed.
    `denied`: the reason is a permission (EACCES/EPERM)."""

    code = "unreadable"

    def __init__(self, message: str, denied: bool = False):
        super().__init__(message)
        self.denied = denied


class ResourceLimitError(TransferError):
    """This process ran out of something its limits bound (open files): not the data's fault,
    and a re-run under the same limit meets it again. Its message names the limit."""

    code = "resource"


class ExistsError(TransferError):
    """A destination file exists and overwriting was not allowed."""

    code = "exists"


class DirectoryInTheWayError(ExistsError):
    """A name in the destination is taken by what --overwrite does not replace: a directory where
    the transfer has a file, or a file where it has a directory (one wire code for both)."""

    code = "exists-dir"


class BusyError(ExistsError):
    """Another transfer that is still running is writing a file this one names."""

    code = "busy"


# What a sender is told (busy, retried) when another sender of the same transfer committed it
# under it: its retry hears "complete". The sender knows it by these words (older senders by the
# code alone), so that a send out of --retry-for still makes that one retry.
FINISHED_MEANWHILE = "another sender of this transfer committed it a moment ago; a retry finds it complete"


class FinishedMeanwhileError(BusyError):
    """Another sender of this very transfer (the same source sent twice at once, or three times)
    committed it while this one was still at it. Sent as `busy`, which the sender retries: its
    retry hears that the transfer is complete. Not in _BY_CODE: a sender reads it as BusyError."""


class ChunkSizeError(TransferError):
    """The receiver holds verified chunks of these very files cut at another chunk size: the sender
    should re-plan with `chunk_size` (the receiver's) so that none of them is sent again."""

    code = "chunk-size"

    def __init__(self, message: str, chunk_size: int = 0):
        super().__init__(message)
        self.chunk_size = chunk_size

    def details(self) -> dict[str, int]:
        return {"chunk_size": self.chunk_size}


class NoSpaceError(TransferError):
    """The receiver ran out of disk space; what was verified so far is kept for resume."""

    code = "no-space"


class PeerUnreachableError(TransferError):
    """The peer could not be reached, or the connection was lost and retries ran out."""

    code = "unreachable"


class UnresolvedError(PeerUnreachableError):
    """The receiver's host name does not resolve: refused at once, not retried as if the peer
    were down (a misspelt name stays misspelt for the minute of retries)."""


class StalledError(PeerUnreachableError):
    """The receiver confirmed nothing for the ack timeout while chunks waited (stopped, hung, or
    its disk stalled): the connection is dropped and retried like a lost one."""


class TlsMismatchError(TransferError):
    """One side runs TCP with --tls and the other without: a flag to fix, not a peer to retry."""

    code = "tls-mismatch"


class UnsupportedError(TransferError):
    """The requested transport or feature is not available on this machine."""

    code = "unsupported"


class UnknownTransferError(ProtocolError):
    """A data channel named a transfer the receiver has no plan for."""

    code = "unknown-transfer"


_BY_CODE: dict[str, type[TransferError]] = {
    cls.code: cls
    for cls in (
        TransferError,
        ProtocolError,
        UnsafeNameError,
        LimitError,
        AuthError,
        VerifyError,
        SourceChangedError,
        SourceUnreadableError,
        ExistsError,
        DirectoryInTheWayError,
        BusyError,
        ChunkSizeError,
        NoSpaceError,
        PeerUnreachableError,
        UnsupportedError,
        UnknownTransferError,
        TlsMismatchError,
    )
}


def error_from_code(code: str, message: str, info: dict[str, object] | None = None) -> TransferError:
    """The exception a sender raises for the receiver's ERROR frame (`info`: the frame's JSON)."""
    cls = _BY_CODE.get(code, TransferError)
    if cls is ChunkSizeError:
        size = (info or {}).get("chunk_size")
        if not isinstance(size, int) or isinstance(size, bool):
            return ProtocolError(f"{message} (no chunk size given)")
        return ChunkSizeError(message, size)
    return cls(message)
