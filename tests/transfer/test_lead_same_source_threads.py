"""Threads of one process sending the SAME source at once to one library Receiver (th): with
sender and receiver in one process 5 of 6 runs had a send fail, with `receiver cannot write
'srcA/f2.bin': No such file or directory`, `srcA/f1.bin: 1 chunks still missing at commit` or
`transfer already finished`. The sends have one transfer id, so the receiver gives them one plan;
the first to commit moved the .part files away (and re-planned them halfway) under the others,
which were still writing and flushing. Now the commit runs alone against the plan's writes, and a
send whose transfer another one committed under it is told `busy`, retries, and hears "complete".

The receiver's chunk writes are slowed a little so that the sends overlap, and every COMMIT but the
first waits a moment, so that the others come after the first one's commit every time (before,
two commits at the same moment could both get through, and this test passed 3 runs in 6)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from transfer import session
from transfer.receiver import Receiver
from transfer.sender import SendOptions, send
from transfer.store import Store
from transfer.tcp import TcpTransport
from transfer.transport import ConnectOptions, Identity, ListenOptions

pytestmark = pytest.mark.integration

TOKEN = b"same-source-token-0123456789abcd"
CS = 64 * 1024
SIZES = (3 * CS + 11, 16 * CS, 24 * CS + 5)  # srcA's three files (th's: 3, 6 and 9 MB)
SENDERS = 3
ROUNDS = 2


def _source(root: Path) -> Path:
    src = root / "srcA"
    src.mkdir()
    for i, size in enumerate(SIZES):
        (src / f"f{i}.bin").write_bytes(os.urandom(size))
    return src


@contextmanager
def _receiver(dest: Path) -> Iterator[int]:
    """The library receiver as th ran it: overwrite=True, no owner, TCP without TLS on loopback."""
    rx = Receiver(dest, TOKEN, overwrite=True)
    lst = TcpTransport().listen(
        ListenOptions("127.0.0.1", 0, Identity(b"", b"", ""), tls=False), rx.handle_channel
    )
    thread = threading.Thread(target=lst.serve_forever, daemon=True)
    thread.start()
    try:
        yield lst.address[1]
    finally:
        lst.close()
        thread.join(timeout=5)
        rx.close()


def _slow_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    real = Store.write_direct

    def slow(self: Store, key: str, view: memoryview, off: int) -> int:
        time.sleep(0.004)  # so that one send's commit lands while the others still write
        return real(self, key, view, off)

    monkeypatch.setattr(Store, "write_direct", slow)


def _later_commits_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    real = session.SenderChannel.commit
    lock = threading.Lock()
    commits = [0]

    def commit(self: session.SenderChannel, roots: list[str]) -> None:
        with lock:
            commits[0] += 1
            first = commits[0] == 1
        if not first:
            time.sleep(0.2)
        real(self, roots)

    monkeypatch.setattr(session.SenderChannel, "commit", commit)


@pytest.mark.parametrize("retry_for", [10.0, 0.0])  # 0: dr4, a send told "busy" out of patience
def test_threads_sending_the_same_source_at_once_all_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, retry_for: float
) -> None:
    src = _source(tmp_path)
    dest = tmp_path / "dst"
    _slow_writes(monkeypatch)
    _later_commits_wait(monkeypatch)
    results: list[dict[str, Any]] = []
    failures: list[str] = []
    with _receiver(dest) as port:
        copts = ConnectOptions("127.0.0.1", port, None, tls=False)
        opts = SendOptions(streams=2, chunk_size=CS, compress="none", retry_for=retry_for)

        def sender(n: int) -> None:
            time.sleep(0.03 * n)  # staggered: each later send joins the first one under way
            for _ in range(ROUNDS):
                try:
                    results.append(send([src], TcpTransport(), copts, TOKEN, opts))
                except Exception as exc:  # what th saw: the send failed
                    failures.append(f"{type(exc).__name__}: {exc}")

        threads = [threading.Thread(target=sender, args=(n,)) for n in range(SENDERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    assert not failures, failures
    assert len(results) == SENDERS * ROUNDS
    assert all(r["verified"] for r in results), results
    for i in range(len(SIZES)):
        name = f"f{i}.bin"
        assert (dest / "srcA" / name).read_bytes() == (src / name).read_bytes(), name
    left = sorted(os.listdir(dest / ".rq-partial"))
    assert not [n for n in left if n.endswith((".live", ".owner", ".manifest.json", ".part"))], left
