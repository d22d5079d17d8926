"""A full disk while the receiver writes one of its own state files (a commit marker's temp name,
`<transfer id>.commit.json.tmpPID.TID`) named that file to the sender: `… writing
'…commit.json.tmp30942.140373691201216'`. Receiver._disk_error's docstring says state files are
never named; the line now says "its state files"."""

from __future__ import annotations

import errno
from pathlib import Path

from transfer.receiver import Receiver

TEMP = "0123456789abcdef0123456789abcdef.commit.json.tmp30942.140373691201216"


def test_a_full_disk_writing_a_state_file_does_not_name_it(tmp_path: Path) -> None:
    rc = Receiver(tmp_path / "dst", b"t")
    try:
        err = str(rc._disk_error(OSError(errno.ENOSPC, "No space left on device", TEMP), None))
    finally:
        rc.close()
    assert "commit.json" not in err and "tmp30942" not in err, err
    assert "writing its state files: No space left on device" in err, err
