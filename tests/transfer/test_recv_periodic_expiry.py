"""A receiver that stays up expires abandoned partial state again as it plans new transfers (at most
every SWEEP_EVERY), not only as it starts; never a transfer still open. Before, a receiver up for
weeks never expired anything (Receiver.__init__ -> Store.recover was the only sweep)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

import transfer.receiver as receiver_mod
from transfer.events import PartialExpired
from transfer.manifest import FileEntry, Manifest, file_key, make_manifest
from transfer.receiver import Receiver

CS = 1 << 20
KEEP = 0.4


def _manifest(name: str) -> Manifest:
    return make_manifest(
        CS, [FileEntry(name=name, size=2 * CS, mode=0o644, key=file_key(name, 2 * CS, 1, 1, CS))]
    )


def test_a_running_receiver_sweeps_again_and_spares_open_transfers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(receiver_mod, "SWEEP_EVERY", 0.0)
    dest = tmp_path / "dest"
    events: list[Any] = []
    rx = Receiver(dest, b"token", on_event=events.append, keep_partial=KEEP)
    try:
        gone, open_one, new = _manifest("gone.bin"), _manifest("open.bin"), _manifest("new.bin")
        # planned and left (a sender that never came back) after the receiver started: its
        # start-up sweep cannot have seen it
        rx._release(gone.transfer_id, rx._acquire(gone.transfer_id, gone))
        held = rx._acquire(open_one.transfer_id, open_one)  # in progress, quiet as long
        time.sleep(KEEP + 0.2)
        rx._release(new.transfer_id, rx._acquire(new.transfer_id, new))
        swept = [e for e in events if isinstance(e, PartialExpired)]
        assert [e.transfers for e in swept] == [(gone.transfer_id,)], events
        assert swept[0].files > 0 and swept[0].older_than == KEEP
        state = dest / ".rq-partial"
        assert not (state / f"{gone.files[0].key}.part").exists()
        assert (state / f"{open_one.files[0].key}.part").exists()  # never a transfer in progress
        assert (state / f"{new.transfer_id}.manifest.json").exists()
        rx._release(open_one.transfer_id, held)
    finally:
        rx.close()
