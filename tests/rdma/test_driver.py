"""The driver's device-free parts: where the channel switches to RDMA, and option parsing."""

from __future__ import annotations

from transfer.frames import FrameType, control, header
from transfer.rdma.driver import RECEIVER, RdmaSettings, frame_boundary_after_upgrade


def test_switch_point_is_right_after_the_first_accept_or_ready() -> None:
    challenge = control(FrameType.CHALLENGE, {"nonce": "x"})
    ready = control(FrameType.READY, {})
    ack = header(FrameType.ACK, 8) + bytes(8)
    assert frame_boundary_after_upgrade(challenge) is None
    assert frame_boundary_after_upgrade(ready) == len(ready)
    assert frame_boundary_after_upgrade(ack + ready + ack) == len(ack) + len(ready)
    accept = control(FrameType.ACCEPT, {"have": {}})
    assert frame_boundary_after_upgrade(accept + ack) == len(accept)
    error = control(FrameType.ERROR, {"code": "auth", "message": "wrong token"})
    assert frame_boundary_after_upgrade(error) is None  # a refusal never upgrades


def test_settings_from_cli_extra() -> None:
    s = RdmaSettings.from_extra({"rdma_device": "mlx5_0", "rdma_port": 2, "gid_index": 3})
    assert (s.device, s.port, s.gid_index) == ("mlx5_0", 2, 3)
    d = RdmaSettings.from_extra({})
    assert (d.device, d.port, d.gid_index) == (None, 1, None)
    assert d.receiver == RECEIVER
