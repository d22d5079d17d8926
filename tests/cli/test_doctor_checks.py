"""Pure unit tests of doctor's findings for what this machine cannot show (RDMA devices, small buffers)."""

from __future__ import annotations

import pytest

from rqcli.commands import doctor


def test_rdma_devices_are_listed_with_ports_and_gids(monkeypatch: pytest.MonkeyPatch) -> None:
    from transfer.rdma import devices

    gid = devices.RdmaGid(index=1, gid="fe80:0000:0000:0000:0000:0000:0000:0001", type="RoCE v2")
    port = devices.RdmaPort(
        number=1, state="ACTIVE", link_layer="Ethernet", active_mtu=4096, max_mtu=4096, lid=0, gids=(gid,)
    )
    dev = devices.RdmaDevice(name="rxe0", node_guid="0000:0000:0000:0001", ports=(port,))
    monkeypatch.setattr(devices, "describe_devices", lambda: [dev])
    finding = doctor.check_rdma()
    assert finding.status == "ok"
    assert "rxe0" in finding.detail and "ACTIVE Ethernet mtu 4096" in finding.detail
    assert "1:fe80:0000:0000:0000:0000:0000:0000:0001 (RoCE v2)" in finding.detail


def test_no_rdma_says_why_and_what_to_use(monkeypatch: pytest.MonkeyPatch) -> None:
    from transfer.rdma import devices
    from transfer.rdma.errors import RdmaUnavailable

    def none() -> list[devices.RdmaDevice]:
        raise RdmaUnavailable("no RDMA device")

    monkeypatch.setattr(devices, "describe_devices", none)
    finding = doctor.check_rdma()
    assert finding.status == "skip"
    assert finding.detail == "no RDMA: no RDMA device"
    assert "--transport quic or tcp" in finding.fix


def test_small_udp_buffers_warn_with_the_sysctl_to_run(monkeypatch: pytest.MonkeyPatch) -> None:
    values = {"/proc/sys/net/core/rmem_max": "212992\n", "/proc/sys/net/core/wmem_max": "212992\n"}
    monkeypatch.setattr(doctor.Path, "read_text", lambda self: values[str(self)])
    finding = doctor.check_udp_buffers()
    assert finding.status == "warn"
    assert "net.core.rmem_max=8388608" in finding.fix


def test_table_prints_bracketed_text_verbatim(monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from rqcli.main import cli

    finding = doctor.Finding("rdma", "skip", "pyverbs is not installed", "pip install 'rqcli[rdma]'")
    monkeypatch.setattr(doctor, "run_checks", lambda *a: [finding])
    result = CliRunner().invoke(cli, ["doctor"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "pip install 'rqcli[rdma]'" in result.output
