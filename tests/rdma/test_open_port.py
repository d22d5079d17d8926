"""verbs._open_port's checks (port exists and is ACTIVE, GID usable), with a stand-in device context:
a pure test of the decisions; opening a real device needs one (test_e2e.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from transfer.rdma import verbs
from transfer.rdma.conninfo import LINK_ETHERNET, gid_from_text
from transfer.rdma.errors import RdmaUnavailable


class _Err(Exception):
    pass


class _Ctx:
    def __init__(self, state: int = 4, gids: dict[int, str] | None = None, ports: int = 1):
        self.state, self.ports, self.closed = state, ports, False
        self.gids = gids if gids is not None else {0: "fe80::1", 1: "::ffff:10.0.0.2"}

    def query_port(self, port: int) -> Any:
        if port > self.ports:
            raise _Err("no port")
        return SimpleNamespace(state=self.state, link_layer=2, lid=0, active_mtu=3, gid_tbl_len=4)

    def query_gid(self, port: int, index: int) -> Any:
        if index not in self.gids and index >= 4:
            raise _Err("bad index")
        return SimpleNamespace(gid=self._text(index))

    def _text(self, index: int) -> str:
        h = gid_from_text(self.gids.get(index, "::")).hex()
        return ":".join(h[i : i + 4] for i in range(0, 32, 4))

    def query_gid_type(self, port: int, index: int) -> int:
        return 1

    def close(self) -> None:
        self.closed = True


V = SimpleNamespace(
    PyverbsError=_Err, e=SimpleNamespace(IBV_LINK_LAYER_ETHERNET=2), pd=SimpleNamespace(PD=lambda ctx: "pd")
)


@pytest.fixture(autouse=True)
def _no_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verbs, "_DEVICES", {})


def test_picks_a_roce_v2_gid_and_caches_the_port() -> None:
    ctx = _Ctx()
    dev = verbs._open_port(V, ctx, "rxe0", 1, None)
    assert (dev.gid_index, dev.link_layer, dev.active_mtu) == (1, LINK_ETHERNET, 3)
    assert dev.gid == gid_from_text("::ffff:10.0.0.2")
    again = _Ctx()
    assert verbs._open_port(V, again, "rxe0", 1, None) is dev and again.closed


def test_missing_or_down_port_and_bad_gid_are_unavailable() -> None:
    with pytest.raises(RdmaUnavailable, match="no port 2"):
        verbs._open_port(V, _Ctx(), "rxe0", 2, None)
    with pytest.raises(RdmaUnavailable, match="DOWN, not ACTIVE"):
        verbs._open_port(V, _Ctx(state=1), "rxe0", 1, None)
    with pytest.raises(RdmaUnavailable, match="no GID index 9"):
        verbs._open_port(V, _Ctx(), "rxe0", 1, 9)
    with pytest.raises(RdmaUnavailable, match="is empty"):
        verbs._open_port(V, _Ctx(), "rxe0", 1, 3)
