"""A receiver killed in the middle of a commit, seen by another transfer and by the next receiver;
and what a finished (or refused) transfer leaves under DEST/.rq-partial."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from xfer_kit import receive_chunks

from transfer.errors import ExistsError
from transfer.manifest import FileEntry, Manifest, file_key, make_manifest
from transfer.store import Store

CS = 64 * 1024


class _Killed(Exception):
    """Stands for kill -9 of the receiver at one point of a commit."""


def _entries(n: int) -> tuple[list[FileEntry], list[bytes]]:
    datas = [os.urandom(CS + 11 * i) for i in range(n)]
    names = [f"ck/f{i}.bin" for i in range(n)]
    entries = [
        FileEntry(name=nm, size=len(d), mode=0o644, key=file_key(nm, len(d), 1, i, CS))
        for i, (nm, d) in enumerate(zip(names, datas, strict=True))
    ]
    return entries, datas


def _receive(store: Store, m: Manifest, datas: dict[str, bytes]) -> list[str]:
    return receive_chunks(store, m, [datas[entry.name] for entry in m.files], CS)


def _kill_after_first_link(store: Store, m: Manifest, roots: list[str], mp: pytest.MonkeyPatch) -> list[str]:
    """Commits `m` with the receiver "killed" right after its first link; returns what it linked."""
    link_one, linked = Store._link_one, []

    def link_then_die(self: Store, entry: FileEntry, final: str, parent: int, overwrite: bool) -> bool:
        if linked:
            raise _Killed
        linked.append(entry.name)
        return link_one(self, entry, final, parent, overwrite)

    mp.setattr(Store, "_link_one", link_then_die)
    plan = store.plan(m)
    with pytest.raises(_Killed):
        plan.finalize(roots, False)
    mp.undo()
    plan.close()  # the killed process's flock on <tid>.live goes with it
    return linked


@pytest.mark.parametrize("nfiles", [2, 6])  # per-file fsyncs, and a syncfs batch
def test_files_a_killed_commit_linked_are_rq_s_for_another_transfer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nfiles: int
) -> None:
    """Was: a receiver killed after linking some files of a commit left them without placed
    records, and a different transfer naming one (the same file version) was refused exit 9
    'already exists' although rq put it there. The records now go down before the links."""
    entries, datas = _entries(nfiles)
    by_name = {e.name: d for e, d in zip(entries, datas, strict=True)}
    t1 = make_manifest(CS, entries)
    store = Store(tmp_path)
    roots = _receive(store, t1, by_name)
    linked = _kill_after_first_link(store, t1, roots, monkeypatch)
    store.close()
    assert (tmp_path / linked[0]).read_bytes() == by_name[linked[0]]

    # another transfer: the linked file, the same version, plus a new one; no receiver restart
    # needed for the linked file to count as rq's (the plan of T2 also finishes T1's commit)
    extra = FileEntry(name="ck/new.bin", size=100, mode=0o644, key=file_key("ck/new.bin", 100, 1, 99, CS))
    by_name[extra.name] = os.urandom(100)
    first = next(e for e in entries if e.name == linked[0])
    t2 = make_manifest(CS, [first, extra])
    store = Store(tmp_path)
    plan = store.plan(t2)
    assert plan.files[0].placed, "the file the killed commit linked was not recognised as placed"
    plan.close()
    for e in entries:  # T1's commit was finished on the way
        assert (tmp_path / e.name).read_bytes() == by_name[e.name]
    assert store.completed(t1)
    roots2 = _receive(store, t2, by_name)
    store.plan(t2).finalize(roots2, False)
    assert (tmp_path / extra.name).read_bytes() == by_name[extra.name]
    store.close()


def test_a_new_receiver_finishes_a_killed_commit_as_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The next `rq recv` on DEST (Store.recover, called by Receiver) places what the killed
    commit had not, before any sender comes back."""
    entries, datas = _entries(4)
    by_name = {e.name: d for e, d in zip(entries, datas, strict=True)}
    t1 = make_manifest(CS, entries)
    store = Store(tmp_path)
    roots = _receive(store, t1, by_name)
    _kill_after_first_link(store, t1, roots, monkeypatch)
    store.close()

    store = Store(tmp_path)
    store.recover()
    for e in entries:
        assert (tmp_path / e.name).read_bytes() == by_name[e.name]
    state = tmp_path / ".rq-partial"
    assert not list(state.glob("*.part")) and not list(state.glob("*.commit.json"))
    assert (state / f"{t1.transfer_id}.done.json").exists()
    store.close()


def test_a_refused_transfer_leaves_no_lock_files_and_recover_prunes_leftovers(tmp_path: Path) -> None:
    """Was: a plan refused (a file in the way) left `<tid>.owner` for good, and nothing ever
    pruned records of files deleted since or temp files of dead writers."""
    entries, datas = _entries(2)
    by_name = {e.name: d for e, d in zip(entries, datas, strict=True)}
    (tmp_path / "ck").mkdir()
    (tmp_path / entries[0].name).write_bytes(b"user's own")
    m = make_manifest(CS, entries)
    store = Store(tmp_path)
    with pytest.raises(ExistsError):
        store.plan(m)
    state = tmp_path / ".rq-partial"
    assert sorted(p.name for p in state.iterdir()) == []
    (tmp_path / entries[0].name).unlink()
    store.plan(m).finalize(_receive(store, m, by_name), False)
    kept = sorted(p.name for p in state.iterdir())
    assert len(kept) == 1 + len(entries)  # done marker; per file its placed record (with its digests)
    # a writer killed between writing and renaming a state file (pid 2**22+1: no such process)
    (state / f"{m.transfer_id}.manifest.json.tmp{2**22 + 1}.7").write_bytes(b"{")
    (tmp_path / entries[1].name).unlink()  # the user deletes one received file
    store.recover()
    left = sorted(p.name for p in state.iterdir())
    assert len(left) == 1 + 1, left  # its record went with it; nothing else stayed
    (tmp_path / entries[0].name).unlink()
    store.recover()
    assert sorted(p.name for p in state.iterdir()) == []  # nothing rq placed is left: nothing kept
    store.close()
