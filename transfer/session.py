"""The sans-I/O protocol core: frames in, frames and events out. No sockets, files or clocks here.

One *channel* is one ordered, reliable pipe of frames (a TCP connection, a QUIC stream, an RDMA queue
pair). Every channel opens with HELLO → CHALLENGE → AUTH. The *control* channel then sends the
MANIFEST and gets ACCEPT (what the receiver already has); *data* channels get READY. Chunks flow on
data channels in any order; the receiver verifies each (codec cap, length, xxh3-128) before it counts,
and ACKs it only once the driver reports it durable. COMMIT on the control channel asks the receiver
to check every root digest and put the files in place.

Both sides are plain objects the drivers (tcp.py, quic.py, rdma/) feed; the same core gives every
transport authentication, limits, verification and resume.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass
from typing import Any

from transfer import codec
from transfer.constants import AUTH_VERSION as AUTH_VERSION
from transfer.errors import (
    AuthError,
    ChunkSizeError,
    PeerUnreachableError,
    ProtocolError,
    TransferError,
    VerifyError,
    error_from_code,
)
from transfer.frames import (
    ChunkHeader,
    Frame,
    FrameType,
    control,
    error_frame,
    pairs_frame,
    parse_chunk,
    parse_pairs,
)
from transfer.manifest import Limits, Manifest, parse_manifest

CONTROL = "control"
# characters of an ERROR's text shown from a peer that has not authenticated (docs/transfer.md)
UNAUTHENTICATED_TEXT = 200
DATA = "data"
MAX_REJECTS_PER_CHANNEL = 64


# Optional behaviour a peer announces (docs/protocol.md, "Additions within wire version 1"): the
# sender lists what it understands in HELLO's "features"; the receiver uses a feature only with a
# sender that listed it and says so in ACCEPT. An older peer sends and reads no such field.
# "progress": while the receiver works on a COMMIT it sends PROGRESS every ACCEPT's "progress"
# seconds, and the sender waits for a few such intervals of silence instead of its long COMMIT wait.
FEATURE_PROGRESS = "progress"
RESTARTED_LISTED = 1000  # restarted files an ACCEPT lists by index (its count says how many in all)
FEATURES = (FEATURE_PROGRESS,)
# What a receiver may announce as its PROGRESS interval, in seconds.
PROGRESS_MIN_S, PROGRESS_MAX_S = 0.01, 600.0

# HELLO carries "auth": AUTH_VERSION (kept in transfer.constants, light to import for rq --version).
SENDER = "sender"
RECEIVER = "receiver"


def _mac(token: bytes, prover: str, server_nonce: bytes, client_nonce: bytes, role: str, tid: str) -> str:
    # `prover` keeps the two directions apart (one side's MAC is never the other's proof: no
    # reflection); the nonces are fixed-size, role is "control"/"data" and ends in NUL, so no two
    # different inputs concatenate to the same message
    msg = (
        b"rq-auth-2\0"
        + prover.encode()
        + b"\0"
        + client_nonce
        + server_nonce
        + role.encode()
        + b"\0"
        + tid.encode()
    )
    return hmac.new(token, msg, hashlib.sha256).hexdigest()


def auth_mac(token: bytes, server_nonce: bytes, client_nonce: bytes, role: str, tid: str) -> str:
    """The sender's proof (AUTH) that it knows the token without sending it (TCP may run without TLS)."""
    return _mac(token, SENDER, server_nonce, client_nonce, role, tid)


def receiver_proof(token: bytes, server_nonce: bytes, client_nonce: bytes, role: str, tid: str) -> str:
    """The receiver's proof (in CHALLENGE) that it knows the token: the sender checks it before it
    sends its own MAC, the manifest or any data. Covers the sender's fresh nonce, so it cannot be
    replayed from an earlier session."""
    return _mac(token, RECEIVER, server_nonce, client_nonce, role, tid)


def _same(mac: object, want: str) -> bool:
    # bytes, not str: compare_digest refuses non-ASCII strings with a TypeError
    return isinstance(mac, str) and hmac.compare_digest(mac.encode(), want.encode())


def _nonce(obj: dict[str, Any]) -> bytes:
    value = obj.get("nonce")
    if not isinstance(value, str):
        raise ProtocolError("bad nonce")
    try:
        raw = base64.b64decode(value, validate=True)
    except ValueError:
        raise ProtocolError("bad nonce") from None
    if len(raw) != 16:
        raise ProtocolError("nonce must be 16 bytes")
    return raw


# -- events the receiver core hands its driver -------------------------------------------------


@dataclass(frozen=True)
class Authenticated:
    role: str
    transfer_id: str


@dataclass(frozen=True)
class ManifestReceived:
    manifest: Manifest


@dataclass(frozen=True)
class ChunkVerified:
    file: int
    index: int
    data: bytes | memoryview
    digest: bytes
    wire_bytes: int


@dataclass(frozen=True)
class ChunkRejected:
    file: int
    index: int
    reason: str


@dataclass(frozen=True)
class FlushRequested:
    pass


@dataclass(frozen=True)
class CommitRequested:
    roots: list[str]


def _features(obj: dict[str, Any]) -> frozenset[str]:
    """HELLO's "features" (absent from an older sender): the names it lists, others ignored."""
    listed = obj.get("features")
    if not isinstance(listed, list):
        return frozenset()
    return frozenset(f for f in listed[:64] if isinstance(f, str) and f in FEATURES)


ReceiverEvent = (
    Authenticated | ManifestReceived | ChunkVerified | ChunkRejected | FlushRequested | CommitRequested
)


class ReceiverChannel:
    """The receiver's half of one channel. `handle` returns events; frames to send pile up in `outbox`."""

    def __init__(self, token: bytes, server_nonce: bytes, limits: Limits):
        self._token = token
        self._nonce = server_nonce
        self._limits = limits
        self._client_nonce = b""
        self.role = ""
        self.transfer_id = ""
        self.state = "hello"
        self.manifest: Manifest | None = None
        self.outbox: list[bytes] = []
        self.rejects = 0
        self.peer_features: frozenset[str] = frozenset()
        # seconds between PROGRESS frames while a COMMIT is worked on, once ACCEPT announced it to
        # a sender that asked (None: an older sender, or none offered)
        self.progress_every: float | None = None

    def handle(self, frame: Frame) -> list[ReceiverEvent]:
        if frame.type is FrameType.ERROR:
            info = frame.json_object()
            code, text = str(info.get("code"))[:32], str(info.get("message"))
            if self.state in ("hello", "auth"):
                # anyone who can connect may send this: its words are not a sender's, and up to
                # 64 KiB of them went to the receiver's log (and back to the peer) as "sender: ..."
                cut = text[:UNAUTHENTICATED_TEXT] + ("…" if len(text) > UNAUTHENTICATED_TEXT else "")
                raise error_from_code(code, f"a peer that had not proved the token ended with: {cut}")
            raise error_from_code(code, f"sender: {text}")
        handler = getattr(self, f"_on_{self.state}")
        result: list[ReceiverEvent] = handler(frame)
        return result

    def _expect(self, frame: Frame, kind: FrameType) -> None:
        if frame.type is not kind:
            raise ProtocolError(f"expected {kind.name}, got {frame.type.name}")

    def _on_hello(self, frame: Frame) -> list[ReceiverEvent]:
        self._expect(frame, FrameType.HELLO)
        obj = frame.json_object()
        if obj.get("role") not in (CONTROL, DATA):
            raise ProtocolError("HELLO needs a role of 'control' or 'data'")
        self.role = obj["role"]
        self.transfer_id = str(obj.get("transfer_id", ""))[:64]
        self._client_nonce = _nonce(obj)
        self.peer_features = _features(obj)
        peer_auth = obj.get("auth")
        if isinstance(peer_auth, int) and not isinstance(peer_auth, bool) and peer_auth > AUTH_VERSION:
            # a later release's scheme: this receiver cannot check it, and must not call it older
            raise AuthError(
                f"that rq send speaks protocol auth {peer_auth}, newer than this rq recv's "
                f"(auth {AUTH_VERSION}): upgrade rq on the receiving side"
            )
        if peer_auth != AUTH_VERSION:
            # an rq send from before mutual authentication: it would not check our proof, so it
            # would as readily send to a receiver without the token. Its user reads this line.
            raise AuthError(
                f"this rq recv authenticates both ways (protocol auth {AUTH_VERSION}) and that rq send "
                "is older: upgrade rq on the sending side"
            )
        proof = receiver_proof(self._token, self._nonce, self._client_nonce, self.role, self.transfer_id)
        challenge = {"nonce": base64.b64encode(self._nonce).decode(), "proof": proof}
        self.outbox.append(control(FrameType.CHALLENGE, challenge))
        self.state = "auth"
        return []

    def _on_auth(self, frame: Frame) -> list[ReceiverEvent]:
        self._expect(frame, FrameType.AUTH)
        mac = frame.json_object().get("mac")
        want = auth_mac(self._token, self._nonce, self._client_nonce, self.role, self.transfer_id)
        if not _same(mac, want):
            raise AuthError("wrong token")
        self.state = "manifest" if self.role == CONTROL else "joining"
        return [Authenticated(self.role, self.transfer_id)]

    def _on_manifest(self, frame: Frame) -> list[ReceiverEvent]:
        self._expect(frame, FrameType.MANIFEST)
        manifest = parse_manifest(frame.body, self._limits)
        if manifest.transfer_id != self.transfer_id:
            raise ProtocolError("manifest is for another transfer than HELLO named")
        self.manifest = manifest
        self.state = "planning"
        return [ManifestReceived(manifest)]

    def _on_planning(self, frame: Frame) -> list[ReceiverEvent]:
        raise ProtocolError(f"{frame.type.name} before the receiver accepted the manifest")

    _on_joining = _on_planning

    def accept(
        self,
        manifest: Manifest,
        have: list[dict[int, bytes]],
        complete: bool = False,
        data_ports: list[int] | None = None,
        progress_every: float | None = None,
        restarted: list[int] | None = None,
    ) -> None:
        """The driver planned the transfer: tell the sender what is already here (for resume), or that
        the whole transfer already finished here (a sender that died before it read DONE).
        `data_ports`: where this receiver's processes listen; the sender spreads connections over them.
        `progress_every`: the driver sends PROGRESS this often while it works on a COMMIT; announced
        (and `self.progress_every` set) only to a sender whose HELLO listed the feature."""
        self.manifest = manifest
        if complete:
            self.outbox.append(control(FrameType.ACCEPT, {"have": {}, "complete": True}))
            self.state = "closed"
            return
        body: dict[str, Any] = {
            "have": {
                str(i): base64.b64encode(
                    b"".join(k.to_bytes(4, "big") + d for k, d in sorted(h.items()))
                ).decode()
                for i, h in enumerate(have)
                if h
            }
        }
        if data_ports:
            body["data_ports"] = list(data_ports)
        if restarted:
            # the files (manifest indices) whose partial state an earlier attempt left was dropped
            # because their source changed: the sender names them too (an older one ignores it)
            body["restarted"] = list(restarted[:RESTARTED_LISTED])
            body["restarted_count"] = len(restarted)
        if progress_every is not None and FEATURE_PROGRESS in self.peer_features:
            self.progress_every = min(max(progress_every, PROGRESS_MIN_S), PROGRESS_MAX_S)
            body[FEATURE_PROGRESS] = self.progress_every
        self.outbox.append(control(FrameType.ACCEPT, body))
        self.state = "control"

    def ready(self, manifest: Manifest) -> None:
        """The driver found the transfer this data channel joins."""
        self.manifest = manifest
        self.outbox.append(control(FrameType.READY, {}))
        self.state = "data"

    def _on_data(self, frame: Frame) -> list[ReceiverEvent]:
        assert self.manifest is not None
        if frame.type is FrameType.FLUSH:
            return [FlushRequested()]
        self._expect(frame, FrameType.CHUNK)
        head, payload = parse_chunk(frame.body)
        self._check_range(head)
        try:
            data = codec.decode(head.codec, payload, head.raw_len)
            if codec.digest(data) != head.digest:
                raise VerifyError("digest mismatch")
        except VerifyError as exc:
            self.rejects += 1
            if self.rejects > MAX_REJECTS_PER_CHANNEL:
                raise VerifyError(f"too many corrupt chunks on one channel ({self.rejects})") from None
            self.outbox.append(pairs_frame(FrameType.NACK, [(head.file, head.index)]))
            return [ChunkRejected(head.file, head.index, str(exc))]
        return [ChunkVerified(head.file, head.index, data, head.digest, len(frame.body))]

    def _check_range(self, head: ChunkHeader) -> None:
        assert self.manifest is not None
        files = self.manifest.files
        if head.file >= len(files):
            raise ProtocolError(f"chunk for file {head.file}, the manifest has {len(files)}")
        entry = files[head.file]
        cs = self.manifest.chunk_size
        if head.index >= entry.chunks(cs):
            raise ProtocolError(f"chunk {head.index} is past the end of file {head.file}")
        if head.raw_len != entry.chunk_len(head.index, cs):
            raise ProtocolError(
                f"chunk {head.file}/{head.index} claims {head.raw_len} bytes, it has {entry.chunk_len(head.index, cs)}"
            )

    def _on_control(self, frame: Frame) -> list[ReceiverEvent]:
        if frame.type is FrameType.COMMIT:
            obj = frame.json()
            roots = obj.get("roots") if isinstance(obj, dict) else None
            if not isinstance(roots, list) or not all(isinstance(r, str) for r in roots):
                raise ProtocolError("COMMIT needs a list of root digests")
            self.state = "committing"
            return [CommitRequested(roots)]
        if frame.type in (FrameType.CHUNK, FrameType.FLUSH):
            return self._on_data(frame)  # a single-channel transfer may send chunks on control
        raise ProtocolError(f"unexpected {frame.type.name} on the control channel")

    def _on_committing(self, frame: Frame) -> list[ReceiverEvent]:
        raise ProtocolError(f"unexpected {frame.type.name} after COMMIT")

    _on_closed = _on_committing

    def durable(self, pairs: list[tuple[int, int]]) -> None:
        if pairs:
            self.outbox.append(pairs_frame(FrameType.ACK, pairs))

    def progress(self, seconds: float) -> bytes:
        """A PROGRESS frame (the COMMIT is still being worked on), for the driver to send from
        the thread that watches the commit; b"" where the sender did not ask for them."""
        if self.progress_every is None or self.state != "committing":
            return b""
        return control(FrameType.PROGRESS, {"seconds": round(seconds, 3)})

    def done(self, summary: dict[str, Any]) -> None:
        self.outbox.append(control(FrameType.DONE, summary))
        self.state = "closed"

    def fail(self, exc: TransferError) -> None:
        details = exc.details() if isinstance(exc, ChunkSizeError) else None
        self.outbox.append(error_frame(exc.code, str(exc), details))
        self.state = "closed"


# -- the sender's half -------------------------------------------------------------------------


@dataclass(frozen=True)
class Accepted:
    have: list[dict[int, bytes]]
    complete: bool = False
    data_ports: tuple[int, ...] = ()
    # seconds between the PROGRESS frames the receiver sends while it works on the COMMIT; None
    # from an older receiver, which sends none
    progress_every: float | None = None
    # files (manifest indices, at most RESTARTED_LISTED) the receiver restarted because their
    # source changed since an earlier attempt, and how many it restarted in all
    restarted: tuple[int, ...] = ()
    restarted_count: int = 0


@dataclass(frozen=True)
class Ready:
    pass


@dataclass(frozen=True)
class Acked:
    pairs: list[tuple[int, int]]


@dataclass(frozen=True)
class Nacked:
    pairs: list[tuple[int, int]]


@dataclass(frozen=True)
class Done:
    summary: dict[str, Any]


@dataclass(frozen=True)
class Progress:
    """The receiver is still working on the COMMIT (placing files)."""

    seconds: float


SenderEvent = Accepted | Ready | Acked | Nacked | Done | Progress


class SenderChannel:
    """The sender's half of one channel: `start()` gives HELLO, `handle` reacts to the receiver."""

    def __init__(self, token: bytes, role: str, manifest: Manifest, client_nonce: bytes):
        self._token = token
        self.role = role
        self.manifest = manifest
        self._nonce = client_nonce
        self.state = "start"
        self.outbox: list[bytes] = []
        self.progress_every: float | None = None  # what ACCEPT announced (control channel)

    def start(self) -> None:
        hello = {
            "role": self.role,
            "transfer_id": self.manifest.transfer_id,
            "nonce": base64.b64encode(self._nonce).decode(),
            "auth": AUTH_VERSION,
        }
        if self.role == CONTROL:
            hello["features"] = list(FEATURES)
        self.outbox.append(control(FrameType.HELLO, hello))
        self.state = "challenge"

    def handle(self, frame: Frame) -> list[SenderEvent]:
        if frame.type is FrameType.ERROR:
            info = frame.json_object()
            code = str(info.get("code"))
            # "unreachable" is no refusal: the receiver going away (SHUT_DOWN), retried as a lost peer
            said = "receiver" if code == PeerUnreachableError.code else "receiver refused"
            raise error_from_code(code, f"{said}: {info.get('message')}", info)
        if self.state == "challenge":
            if frame.type is not FrameType.CHALLENGE:
                raise ProtocolError(f"expected CHALLENGE, got {frame.type.name}")
            challenge = frame.json_object()
            server_nonce = _nonce(challenge)
            self._check_proof(challenge.get("proof"), server_nonce)
            mac = auth_mac(self._token, server_nonce, self._nonce, self.role, self.manifest.transfer_id)
            self.outbox.append(control(FrameType.AUTH, {"mac": mac}))
            if self.role == CONTROL:
                body = self.manifest.to_json()
                self.outbox.append(control_raw(FrameType.MANIFEST, body))
            self.state = "accept"
            return []
        if self.state == "accept":
            if self.role == CONTROL and frame.type is FrameType.ACCEPT:
                self.state = "running"
                accept = frame.json_object()
                ports = accept.get("data_ports") or []
                if not isinstance(ports, list) or not all(
                    isinstance(p, int) and 0 < p < 65536 for p in ports
                ):
                    raise ProtocolError("bad data_ports in ACCEPT")
                every = accept.get(FEATURE_PROGRESS)
                if every is not None and (
                    isinstance(every, bool)
                    or not isinstance(every, int | float)
                    or not PROGRESS_MIN_S <= every <= PROGRESS_MAX_S
                ):
                    raise ProtocolError("bad progress interval in ACCEPT")
                self.progress_every = None if every is None else float(every)
                have = self._parse_have(accept)
                restarted = accept.get("restarted") or []
                count = accept.get("restarted_count") or 0
                if (
                    not isinstance(restarted, list)
                    or not all(
                        isinstance(i, int) and not isinstance(i, bool) and 0 <= i < len(self.manifest.files)
                        for i in restarted
                    )
                    or not isinstance(count, int)
                    or isinstance(count, bool)
                    or count < len(restarted)
                ):
                    raise ProtocolError("bad restarted files in ACCEPT")
                return [
                    Accepted(
                        have,
                        bool(accept.get("complete")),
                        tuple(ports),
                        self.progress_every,
                        tuple(restarted),
                        count,
                    )
                ]
            if self.role == DATA and frame.type is FrameType.READY:
                self.state = "running"
                return [Ready()]
            raise ProtocolError(f"unexpected {frame.type.name} while waiting to be accepted")
        if frame.type is FrameType.ACK:
            return [Acked(parse_pairs(frame.body))]
        if frame.type is FrameType.NACK:
            return [Nacked(parse_pairs(frame.body))]
        if frame.type is FrameType.DONE:
            return [Done(frame.json_object())]
        if frame.type is FrameType.PROGRESS and self.role == CONTROL and self.progress_every is not None:
            seconds = frame.json_object().get("seconds")
            return [Progress(float(seconds) if isinstance(seconds, int | float) else 0.0)]
        raise ProtocolError(f"unexpected {frame.type.name} from the receiver")

    def _check_proof(self, proof: object, server_nonce: bytes) -> None:
        """Nothing but HELLO goes to a receiver that has not shown it holds the token: neither our
        MAC, nor the manifest (names, sizes), nor any chunk. An ERROR tells its side why."""
        tid = self.manifest.transfer_id
        if proof is None:
            why = (
                "the receiver did not prove it holds the token: it is an rq recv older than this rq send "
                "(upgrade rq on the receiving side) or not rq recv at all; nothing was sent"
            )
            told = (
                "rq send needs the receiver to prove it holds the token (protocol auth 2), which this "
                "rq recv is too old to do: upgrade rq on the receiving side"
            )
        elif not _same(proof, receiver_proof(self._token, server_nonce, self._nonce, self.role, tid)):
            why = (
                "the receiver's proof of the token is wrong: it holds another token, or it is not the "
                "rq recv meant; nothing was sent"
            )
            told = "rq send refused this receiver: its proof of the token is wrong (another token?)"
        else:
            return
        self.outbox.append(error_frame(AuthError.code, told))
        self.state = "closed"
        raise AuthError(why)

    def _parse_have(self, obj: Any) -> list[dict[int, bytes]]:
        have: list[dict[int, bytes]] = [{} for _ in self.manifest.files]
        listed = obj.get("have") or {}
        if not isinstance(listed, dict):
            raise ProtocolError("bad ACCEPT body: 'have' is not an object")
        for key, blob in listed.items():
            # a key that is not a file index, or a blob that is not base64, is the peer's fault
            # (ProtocolError, exit 1), never an "unexpected ValueError"
            if not (isinstance(key, str) and key.isascii() and key.isdecimal()) or not isinstance(blob, str):
                raise ProtocolError(
                    f"bad ACCEPT body: 'have' entry {key[:40]!r} is not a file index and base64"
                )
            try:
                raw = base64.b64decode(blob, validate=True)
            except ValueError:
                raise ProtocolError(f"bad ACCEPT body: 'have' of file {key[:40]} is not base64") from None
            i = int(key)
            if not 0 <= i < len(have) or len(raw) % 20:
                raise ProtocolError("bad ACCEPT body")
            have[i] = {
                int.from_bytes(raw[o : o + 4], "big"): raw[o + 4 : o + 20] for o in range(0, len(raw), 20)
            }
        return have

    def commit(self, roots: list[str]) -> None:
        self.outbox.append(control(FrameType.COMMIT, {"roots": roots}))


def control_raw(ftype: FrameType, body: bytes) -> bytes:
    from transfer.frames import header

    return header(ftype, len(body)) + body
