"""Store.recover (what rq recv does as it starts) lists the state directory once for its three
steps (finish cut-short commits, expire, prune); it listed it three times, which with many
finished transfers kept (a done marker and placed records each) is most of its cost."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import transfer.store as store_mod
from transfer.store import Store


def test_recover_lists_the_state_directory_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store(tmp_path / "dest")
    calls: list[Any] = []
    real = os.listdir

    def counting(path: Any = ".") -> list[str]:
        calls.append(path)
        return real(path)

    monkeypatch.setattr(store_mod.os, "listdir", counting)
    try:
        store.recover(3600.0)
    finally:
        store.close()
    assert len(calls) == 1, calls
