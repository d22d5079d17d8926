"""An idle `rq recv` expires abandoned partial state too, not only as it plans a transfer.

700e3ca made a receiver that stays up sweep again (at most every SWEEP_EVERY) as it plans a new
transfer; one that planned nothing kept a transfer abandoned after its start for good: its
`.part` files, reserved whole (on /dev/shm: RAM), stayed past --keep-partial until the next
transfer came or the receiver restarted."""

from __future__ import annotations

import json
import queue
import threading
from pathlib import Path
from typing import Any

from rqtest import popen_rq_with
from xfer_kit import rq_env

from transfer.manifest import FileEntry, file_key, make_manifest
from transfer.store import Store

CS = 1 << 20


def _lines(proc: Any) -> queue.Queue[dict[str, Any]]:
    q: queue.Queue[dict[str, Any]] = queue.Queue()

    def read() -> None:
        for line in proc.stdout:
            q.put(json.loads(line))

    threading.Thread(target=read, daemon=True).start()
    return q


def test_an_idle_receiver_expires_a_transfer_abandoned_after_it_started(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    proc = popen_rq_with(
        "import transfer.receiver as r; r.SWEEP_EVERY = 0.2",
        *("recv", str(dest), "--listen", "127.0.0.1:0", "--transport", "tcp", "--json"),
        *("--cert-dir", str(tmp_path / "certs"), "--keep-partial", "0.5s"),
        env=rq_env(),
    )
    try:
        lines = _lines(proc)
        assert lines.get(timeout=30)["event"] == "listening"
        # planned and left after the receiver started (a sender that never came back): the
        # start-up sweep cannot have seen it, and nothing is planned after it
        m = make_manifest(CS, [FileEntry("gone.bin", 2 * CS, 0o644, file_key("gone.bin", 2 * CS, 1, 1, CS))])
        store = Store(dest)
        store.plan(m).close()
        store.close()
        part = dest / ".rq-partial" / f"{m.files[0].key}.part"
        assert part.exists()
        expired = lines.get(timeout=15)  # 0.5 s untouched, then the next sweep; old code: none
        assert expired["event"] == "expired" and expired["transfers"] == [m.transfer_id], expired
        assert not part.exists()
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(10)
