"""Fixtures for the cache tests: a private cache dir + RAM dir per test, seeding helpers, a fault proxy."""

from __future__ import annotations

import shutil
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from faultproxy import FaultProxy
from s3fake import ENV, FakeS3, fake_s3


@pytest.fixture
def ram_dir() -> Iterator[Path]:
    path = Path("/dev/shm") / f"rqtest-{uuid.uuid4().hex[:10]}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def cache_env(tmp_path: Path, ram_dir: Path, aws_env: dict[str, str]) -> dict[str, str]:
    """Environment for `rq` subprocesses: test S3 credentials, a private cache dir and RAM dir."""
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    from cache import Cache

    Cache(cache_dir, ram_dir=ram_dir).close()  # fixes the RAM root for this cache dir
    return {**aws_env, "RQ_CACHE_DIR": str(cache_dir)}


@pytest.fixture
def proxy_factory(services: Any) -> Iterator[Any]:
    made: list[FaultProxy] = []
    upstream = int(services.s3_endpoint.rsplit(":", 1)[1])

    def make(**kwargs: Any) -> FaultProxy:
        proxy = FaultProxy(upstream, **kwargs)
        made.append(proxy)
        return proxy

    yield make
    for proxy in made:
        proxy.stop()


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeS3]:
    """A fake S3 store of the test's own (s3fake), with its credentials in the environment."""
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    with fake_s3() as fake:
        yield fake
