"""A plan lists DEST/.rq-partial once. With 10,000 finished transfers kept there (a done marker and a
placed record each) every listing costs milliseconds, and a plan listed it three times (finishing
cut-short commits, then _other_manifests twice) and parsed every other transfer's manifest twice."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from transfer import codec
from transfer.errors import ChunkSizeError
from transfer.manifest import FileEntry, file_ident, file_key, make_manifest
from transfer.store import Store

CS = 64 * 1024


def _entry(name: str, size: int, inode: int, cs: int = CS) -> FileEntry:
    return FileEntry(
        name, size, 0o644, file_key(name, size, 1, inode, cs), ident=file_ident(name, size, 1, inode)
    )


def test_a_plan_lists_the_state_directory_once_and_keeps_its_checks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store(tmp_path)
    # an unfinished transfer of a.bin at another chunk size with a verified chunk: its manifest is
    # what the chunk-size check and the stale-partial drop read (each used to list and parse again)
    other = make_manifest(2 * CS, [_entry("a.bin", 4 * CS, 7, 2 * CS)])
    plan = store.plan(other)
    plan.write(0, 0, b"x" * 2 * CS)
    plan.make_durable([(0, 0, codec.digest(b"x" * 2 * CS))])
    plan.close()

    listed: list[int] = []
    listdir = os.listdir

    def counting(path: int) -> list[str]:
        listed.append(path)
        return listdir(path)

    monkeypatch.setattr(os, "listdir", counting)
    # the same file version at CS: the receiver answers with the size it holds chunks at
    with pytest.raises(ChunkSizeError) as err:
        store.plan(make_manifest(CS, [_entry("a.bin", 4 * CS, 7)]))
    assert err.value.details()["chunk_size"] == 2 * CS
    assert len(listed) == 1, f"{len(listed)} listings for one plan"  # old code: 2 before it refused
    listed.clear()
    # a changed a.bin (another version): the older transfer's partial state is dropped, restarted
    fresh = store.plan(make_manifest(CS, [_entry("a.bin", 4 * CS, 8)]))
    assert fresh.restarted == ["a.bin"]
    assert len(listed) == 1, f"{len(listed)} listings for one plan"  # old code: 3
    fresh.close()
    assert not (tmp_path / ".rq-partial" / f"{other.transfer_id}.manifest.json").exists()
    store.close()
