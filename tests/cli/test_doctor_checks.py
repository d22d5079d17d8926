"""Pure unit tests of doctor's findings for what this machine cannot show (RDMA devices, small buffers)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from rqtest import run_rq

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


def test_a_bad_shared_environment_url_is_a_warning_not_a_stop(tmp_path: Path) -> None:
    """A stale RQ_NATS_URL or AWS_ENDPOINT_URL aborted the whole doctor (exit 2, no findings);
    docs/cli.md says it only warns. Given as a flag, it is still a usage error."""
    env = {**os.environ, "RQ_NATS_URL": "http://127.0.0.1:14222", "AWS_ENDPOINT_URL": "garbage"}
    res = run_rq("--json", "doctor", "--cache-dir", str(tmp_path / "c"), env=env)
    found = {f["check"]: f for f in map(json.loads, res.stdout.splitlines()) if f.get("event") == "finding"}
    assert (
        found["nats"]["status"] == "warn"
        and "not a nats:// URL (from RQ_NATS_URL)" in found["nats"]["detail"]
    )
    assert found["s3"]["status"] == "warn" and "(from AWS_ENDPOINT_URL)" in found["s3"]["detail"]
    assert json.loads(res.stdout.splitlines()[-1])["event"] == "summary", res.stdout
    res = run_rq("doctor", "--nats-url", "http://127.0.0.1:14222", env=env)
    assert res.returncode == 2 and b"not a nats:// URL" in res.stderr, res.stderr


def test_a_bad_bucket_name_is_a_usage_error_in_one_short_line(tmp_path: Path) -> None:
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"}
    res = run_rq("doctor", "--bucket", "bad bucket!", "--endpoint-url", "http://127.0.0.1:9", env=env)
    assert res.returncode == 2, res.stderr  # exit 6 with boto's page of regular expressions before
    assert (
        res.stderr.decode().splitlines()[-1]
        == "rq: error: bucket name 'bad bucket!' is not valid — check --bucket"
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="a read-only bind mount needs root (unshare -m)")
def test_a_cache_dir_on_a_read_only_file_system_is_not_ok(tmp_path: Path) -> None:
    """pk: with HOME on a read-only file system doctor said `cache-disk ok … (not created yet)`
    while `rq preload` there failed 'Read-only file system' (exit 2)."""
    import shutil
    import subprocess
    import sys

    if shutil.which("unshare") is None:
        pytest.skip("no unshare")
    home = tmp_path / "home"
    home.mkdir()
    script = (
        f"mount --bind -o ro {home} {home} && "
        f"HOME={home} XDG_CACHE_HOME= RQ_CACHE_DIR= {sys.executable} -m rqcli doctor --json"
    )
    done = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, timeout=60, check=False)
    if b"mount" in done.stderr and b"denied" in done.stderr:
        pytest.skip("this machine refuses the bind mount")
    [disk] = [f for f in map(json.loads, done.stdout.decode().splitlines()) if f.get("check") == "cache-disk"]
    assert disk["status"] == "warn" and "read-only file system" in disk["detail"], disk
