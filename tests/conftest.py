"""Shared fixtures: the real services (SeaweedFS S3, NATS JetStream, Mosquitto) and a way to run `rq`.

Services are those of scripts/services.sh. If they already run (scripts/test.sh started them, or a
developer did), the tests use them and leave them running; otherwise the session starts them and
stops them at the end. Each test gets its own bucket / stream, removed afterwards.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rqtest import Services, netns_usable, rdma_device_present, rq_command, run_rq

__all__ = ["Services", "rq_command", "run_rq"]

REPO = Path(__file__).resolve().parent.parent
SERVICES = REPO / "scripts" / "services.sh"
STATE = Path(os.environ.get("RQ_SERVICES_DIR", REPO / ".rq-services"))


def _read_env_file(path: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if line.startswith("export ") and "=" in line:
            key, _, value = line[len("export ") :].partition("=")
            env[key] = value
    return env


@pytest.fixture(scope="session", autouse=True)
def _no_ram_roots_left_behind(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Caches that tests make under tmp_path get a RAM root in /dev/shm named after that path; the
    suite removes the ones it made: those whose `owner` is under its own base temp directory,
    blobs and all (a RAM-tier test's entries stayed in /dev/shm after every run, memory that only
    `rq cache orphans --remove` gave back), and, without pytest-xdist, other new roots that hold
    no files. Under pytest-xdist each worker removes only its own: another worker's test may be
    using a root right now."""
    from cache.orphans import read_owner

    shm = Path("/dev/shm")
    base = tmp_path_factory.getbasetemp().resolve()
    shared = os.environ.get("PYTEST_XDIST_WORKER") is not None
    before = set(shm.glob("rq-cache-*"))
    yield
    for root in set(shm.glob("rq-cache-*")) - before:
        if not root.is_dir() or root.is_symlink():
            continue
        owner = read_owner(root)
        mine = owner is not None and owner.resolve().is_relative_to(base)
        if mine or (
            not shared and not any(p.is_file() for sub in ("objects", "tmp") for p in (root / sub).rglob("*"))
        ):
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def services() -> Iterator[Services]:
    import fcntl

    STATE.mkdir(parents=True, exist_ok=True)
    # pytest-xdist runs this in each worker: one starts the services, the others wait and find them
    with open(STATE / ".start.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        out = subprocess.run(
            ["bash", str(SERVICES), "start"], capture_output=True, text=True, timeout=180, check=False
        )
    if out.returncode != 0:
        pytest.fail(f"scripts/services.sh start failed:\n{out.stdout}\n{out.stderr}")
    # a worker of several must not stop what the others still use (scripts/test.sh stops them)
    started_here = " started" in out.stdout and os.environ.get("PYTEST_XDIST_WORKER") is None
    env = _read_env_file(STATE / "services.env")
    yield Services(
        s3_endpoint=env["RQ_TEST_S3_ENDPOINT"],
        access_key=env["RQ_TEST_AWS_ACCESS_KEY_ID"],
        secret_key=env["RQ_TEST_AWS_SECRET_ACCESS_KEY"],
        nats_url=env["RQ_TEST_NATS_URL"],
        mqtt_url=env.get("RQ_TEST_MQTT_URL"),
    )
    if started_here:
        subprocess.run(["bash", str(SERVICES), "stop"], capture_output=True, timeout=120, check=False)


@pytest.fixture
def aws_env(services: Services, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Points boto3's standard chain (in this process and in subprocesses) at the test S3."""
    env = services.aws_env()
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return env


@pytest.fixture
def s3_client(services: Services) -> Any:
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=services.s3_endpoint,
        aws_access_key_id=services.access_key,
        aws_secret_access_key=services.secret_key,
        region_name="us-east-1",
    )


@pytest.fixture
def bucket(s3_client: Any) -> Iterator[str]:
    """A fresh, empty bucket for one test; emptied and deleted afterwards."""
    name = f"rqtest-{uuid.uuid4().hex[:12]}"
    s3_client.create_bucket(Bucket=name)
    yield name
    paginator = s3_client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=name):
        keys = [{"Key": obj["Key"]} for obj in page.get("Contents", [])]
        if keys:
            s3_client.delete_objects(Bucket=name, Delete={"Objects": keys, "Quiet": True})
    s3_client.delete_bucket(Bucket=name)


@pytest.fixture
def umask_000() -> Iterator[None]:
    """The test runs under umask 000 (the widest a user can set): what rq makes must still be safe."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


@pytest.fixture
def nats_url(services: Services) -> str:
    return services.nats_url


@pytest.fixture
def stream_name(nats_url: str) -> Iterator[str]:
    """A unique JetStream stream name (subject `<name>.>`); the stream is deleted afterwards if created."""
    name = f"RQTEST_{uuid.uuid4().hex[:10].upper()}"
    yield name
    import asyncio

    import nats

    async def drop() -> None:
        nc = await nats.connect(nats_url, connect_timeout=2, max_reconnect_attempts=0)
        try:
            await nc.jetstream().delete_stream(name)
        except Exception:
            pass  # the test never created it
        finally:
            await nc.close()

    asyncio.run(drop())


@pytest.fixture
def mqtt_url(services: Services) -> str:
    if not services.mqtt_url:
        pytest.skip("mosquitto is not installed (apt-get install mosquitto)")
    return services.mqtt_url


def pytest_configure(config: pytest.Config) -> None:
    # A shell without job control starts `cmd &` with SIGINT ignored, and an ignored signal stays
    # ignored across exec: every rq the tests start would then shrug off the SIGINT the interruption
    # tests send (rq rightly keeps an inherited SIG_IGN, as a background job should). Children of
    # this process get the default back.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # get_closest_marker, not keywords: every item under tests/rdma/ has the keyword "rdma" (its directory)
    needs_rdma = [i for i in items if i.get_closest_marker("rdma") is not None]
    if needs_rdma and not rdma_device_present():
        skip = pytest.mark.skip(
            reason="no RDMA device: `ibv_devices` lists none (needs rdma-core and a NIC or rxe)"
        )
        for item in needs_rdma:
            item.add_marker(skip)
    needs_netns = [i for i in items if i.get_closest_marker("netns") is not None]
    if needs_netns and not netns_usable():
        skip = pytest.mark.skip(
            reason="needs root, iproute2 and tc, and permission to create a network namespace"
        )
        for item in needs_netns:
            item.add_marker(skip)
