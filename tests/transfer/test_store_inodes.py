"""Each received file cost 3 inodes: the file, and under .rq-partial its journal and its placed record
(on tmpfs a 4 KiB page each). A file of at most PLACED_DIGESTS_MAX chunks now keeps its chunk digests
in its placed record and its journal goes once it is placed: 2 inodes. What the journal did for a
re-run (give the sender every digest of a file still in place, without reading it) the record does."""

from __future__ import annotations

import os
from pathlib import Path

from xfer_kit import receive_chunks

import transfer.store as store_mod
from transfer.manifest import MIN_CHUNK, FileEntry, Manifest, file_key, make_manifest
from transfer.store import Store

CS = 1 << 20


def _manifest(n: int, size: int = 3000, cs: int = CS) -> tuple[Manifest, list[bytes]]:
    datas = [os.urandom(size) for _ in range(n)]
    entries = [
        FileEntry(
            name=f"ck/f{i:04}.bin", size=size, mode=0o644, key=file_key(f"ck/f{i:04}.bin", size, 5, i, cs)
        )
        for i in range(n)
    ]
    return make_manifest(cs, entries), datas


def _receive(store: Store, m: Manifest, datas: list[bytes]) -> None:
    roots = receive_chunks(
        store, m, [datas[[f.name for f in m.files].index(e.name)] for e in m.files], m.chunk_size
    )
    store.plan(m).finalize(roots, overwrite=False)


def _state(dest: Path) -> list[str]:
    return sorted(p.name for p in (dest / ".rq-partial").iterdir())


def test_a_placed_small_file_keeps_no_journal_and_a_rerun_still_skips_it(tmp_path: Path) -> None:
    m, datas = _manifest(100)
    store = Store(tmp_path)
    _receive(store, m, datas)
    left = _state(tmp_path)
    # per file its placed record only (was: a journal too); and the transfer's done marker
    assert len([n for n in left if n.endswith(".placed")]) == 100
    assert [n for n in left if n.endswith(".journal")] == []
    assert len(left) == 100 + 1
    assert store.completed(m)
    # one file deleted: the re-run is told every other file is there whole, from the records
    victim = m.files[7]
    (tmp_path / victim.name).unlink()
    assert not store.completed(m)
    plan = store.plan(m)
    assert [i for i, fs in enumerate(plan.files) if not plan.has(i, 0)] == [7]
    assert all(fs.placed for i, fs in enumerate(plan.files) if i != 7)
    plan.close()
    _receive(store, m, datas)
    assert store.completed(m)
    assert [n for n in _state(tmp_path) if n.endswith(".journal")] == []
    # and a restarted receiver's prune keeps every record
    store.close()
    store = Store(tmp_path)
    store.recover()
    assert len(_state(tmp_path)) == 101
    assert store.completed(m)
    store.close()


def test_a_file_of_more_chunks_keeps_its_journal(tmp_path: Path) -> None:
    """Above PLACED_DIGESTS_MAX chunks the record would outgrow a block: the journal stays."""
    m, datas = _manifest(1, size=(store_mod.PLACED_DIGESTS_MAX + 1) * MIN_CHUNK, cs=MIN_CHUNK)
    store = Store(tmp_path)
    _receive(store, m, datas)
    assert f"{m.files[0].key}.journal" in _state(tmp_path)
    store.close()
    store = Store(tmp_path)
    store.recover()
    assert store.completed(m)
    store.close()
