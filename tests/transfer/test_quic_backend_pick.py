"""Which QUIC library `--quic-backend auto` takes: qh3 only where a sender can see its backlog."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import pytest

from transfer import quic
from transfer.errors import UnsupportedError


def _without_send_buffer_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """qh3 as releases before 2.1 were: a QuicConnection with no get_send_buffer_size."""
    real = importlib.import_module

    class OldConnection:
        pass

    def fake(name: str, package: str | None = None) -> Any:
        module = real(name, package)
        if name == "qh3.quic.connection":
            old = ModuleType(name)
            old.QuicConnection = OldConnection  # type: ignore[attr-defined]
            return old
        return module

    monkeypatch.setattr(quic.importlib, "import_module", fake)


def test_auto_takes_qh3_that_reports_its_backlog() -> None:
    pytest.importorskip("qh3")
    backend = quic.pick_backend("auto")
    assert backend.name == "qh3" and backend.unsent_of is not None


def test_auto_passes_over_a_qh3_without_send_buffer_size(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("qh3")
    _without_send_buffer_size(monkeypatch)
    assert quic.pick_backend("auto").name == "aioquic"
    with pytest.raises(UnsupportedError, match=r"older than 2\.1.*--quic-backend aioquic"):
        quic.pick_backend("qh3")
