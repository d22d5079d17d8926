"""scripts/lib.sh + scripts/services.sh: a run stops only the services it started itself (real
nats-server and Mosquitto, in a private state directory on free ports: the shared services are
never touched)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bash(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, env=env, timeout=120, check=False
    )


@pytest.mark.skipif(
    not (shutil.which("mosquitto") or Path("/usr/sbin/mosquitto").exists()), reason="mosquitto not installed"
)
def test_a_run_stops_only_the_services_it_started(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "RQ_SERVICES_DIR": str(tmp_path / "state"),
        "RQ_NATS_PORT": str(_free_port()),
        "RQ_MQTT_PORT": str(_free_port()),
        "PATH": f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}",
    }
    services = f"bash {REPO}/scripts/services.sh"
    try:
        r = _bash(f"{services} start nats", env)  # the user's own, already running
        assert r.returncode == 0 and "nats started" in r.stdout, r.stderr
        r = _bash(
            f"source {REPO}/scripts/lib.sh; start_services nats mosquitto || exit 1; "
            'echo "started: $RQ_STARTED_SERVICES"; stop_services_if_started',
            env,
        )
        assert r.returncode == 0, r.stderr
        assert "started: mosquitto\n" in r.stdout
        status = _bash(f"{services} status", env).stdout
        assert "nats running" in status and "mosquitto stopped" in status
        assert (tmp_path / "state" / "services.env").is_file()  # still describes the running nats
    finally:
        _bash(f"{services} stop", env)
    assert "nats stopped" in _bash(f"{services} status", env).stdout


def test_a_stop_from_another_state_dir_leaves_a_running_weeds_sockets(tmp_path: Path) -> None:
    """`services.sh stop` removes weed's gRPC sockets in /tmp (named by the pinned ports) only where
    it stopped its own weed: the test above, stopping from its own state dir, removed the sockets of
    the SeaweedFS the suite runs on, which then failed every write that needed a new volume."""
    base = _free_port() // 10 * 10  # a port base of this test's own: its names are no one's sockets
    sock = Path(f"/tmp/seaweedfs-volume-grpc-{base + 5}.sock")
    sock.write_bytes(b"")
    try:
        env = {**os.environ, "RQ_SERVICES_DIR": str(tmp_path / "state"), "RQ_WEED_BASE_PORT": str(base)}
        r = _bash(f"bash {REPO}/scripts/services.sh stop", env)
        assert r.returncode == 0, r.stderr
        assert sock.exists()
    finally:
        sock.unlink(missing_ok=True)
