"""A fake `rq recv` on TCP (no TLS) speaking the wire protocol by hand, for what a real receiver never
does: answer without knowing the token, answer as an older rq, stall after COMMIT, send a bad
ACCEPT. It records every frame it is sent, so a test can say what reached it."""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import threading
from dataclasses import dataclass, field
from typing import Any

from rqtest import recv_exactly

from transfer import session
from transfer.frames import HEADER, FrameType, control, pairs_frame

MODES = (
    "no-proof",  # an rq recv from before mutual authentication, or an impostor: CHALLENGE {nonce}
    "bad-proof",  # an impostor guessing: CHALLENGE {nonce, proof} with a proof of another token
    "stall-commit",  # knows the token, forgets what it acknowledged, never answers COMMIT
    "bad-accept",  # knows the token, answers the MANIFEST with an ACCEPT whose `have` is not indexed
)


@dataclass
class FakeReceiver:
    mode: str
    token: bytes = b""
    frames: list[str] = field(default_factory=list)  # the names of the frames it was sent, in order
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        assert self.mode in MODES, self.mode
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.sock.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._closed = True
        self.sock.close()

    def __enter__(self) -> FakeReceiver:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def count(self, name: str) -> int:
        with self.lock:
            return self.frames.count(name)

    def seen(self) -> set[str]:
        with self.lock:
            return set(self.frames)

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> tuple[FrameType, bytes]:
        _magic, _version, kind, length = HEADER.unpack(recv_exactly(conn, HEADER.size))
        body = recv_exactly(conn, length)
        ftype = FrameType(kind)
        with self.lock:
            self.frames.append(ftype.name)
        return ftype, body

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn:
                self._converse(conn)
        except (EOFError, OSError, ValueError):
            pass

    def _converse(self, conn: socket.socket) -> None:
        _, body = self._read(conn)
        hello = json.loads(body)
        role, tid = hello["role"], hello["transfer_id"]
        client_nonce = base64.b64decode(hello["nonce"])
        nonce = os.urandom(16)
        challenge: dict[str, Any] = {"nonce": base64.b64encode(nonce).decode()}
        # (looked up here: the fake also plays against an rq from before auth 2, which has none)
        prove = getattr(session, "receiver_proof", None)
        if prove is not None and self.mode == "bad-proof":
            challenge["proof"] = prove(b"not the token", nonce, client_nonce, role, tid)
        elif prove is not None and self.mode != "no-proof":
            challenge["proof"] = prove(self.token, nonce, client_nonce, role, tid)
        conn.sendall(control(FrameType.CHALLENGE, challenge))
        self._read(conn)  # AUTH (or the sender's ERROR)
        if role == "control":
            _, body = self._read(conn)
            manifest = json.loads(body)
            if self.mode == "bad-accept":
                conn.sendall(control(FrameType.ACCEPT, {"have": {"abc": "!!"}}))
                self._read(conn)  # until the sender hangs up
                return
            conn.sendall(control(FrameType.ACCEPT, {"have": {}}))  # nothing kept, every time
            assert manifest["transfer_id"] == tid
        else:
            conn.sendall(control(FrameType.READY, {}))
        while True:
            ftype, body = self._read(conn)
            if ftype is FrameType.CHUNK:
                f, k = struct.unpack_from("!II", body)
                conn.sendall(pairs_frame(FrameType.ACK, [(f, k)]))
            # COMMIT (stall-commit): no DONE, ever; the sender has to give up on its own
