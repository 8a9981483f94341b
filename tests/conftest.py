"""Fixtures with real parts: a real redis-server, real gateway and worker processes."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.processes import Proc, start_gateway, start_worker
from tests.support.stores import Stores
from tests.support.waiting import FACTOR
from voxroom.store.server import RedisServer


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """ChatTTS tests are ``serial`` too: the model's threads keep both cores busy, and the tests
    beside them would be measured on what is left. Every test's timeout (its own ``timeout`` mark,
    or the ini's) times ``VOXROOM_TEST_TIMEOUT_FACTOR`` (tests/support/waiting.py)."""
    for item in items:
        if item.get_closest_marker("chattts") is not None:
            item.add_marker(pytest.mark.serial)
    if FACTOR == 1:
        return
    default = float(config.getini("timeout") or 0)
    for item in items:
        marker = item.get_closest_marker("timeout")
        base = float(marker.args[0]) if marker is not None and marker.args else default
        if base:
            item.add_marker(pytest.mark.timeout(base * FACTOR), append=False)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture
def room() -> str:
    """A fresh room id per test: tests share one Redis and never see each other's rooms."""
    return f"t-{uuid.uuid4().hex[:10]}"


@dataclass
class Stack:
    redis_url: str
    gateway: Proc
    port: int
    worker: Proc


@pytest.fixture(scope="session")
def stack(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One gateway and one worker (offline voices, two CPU contexts) shared by the e2e tests."""
    logs: Path = tmp_path_factory.mktemp("stack-logs")
    worker = start_worker(redis_url, logs, engine="offline", contexts=2)
    gateway, port = start_gateway(redis_url, logs)
    try:
        yield Stack(redis_url, gateway, port, worker)
    finally:
        gateway.stop()
        worker.stop()


@pytest.fixture
async def stores() -> AsyncIterator[Stores]:
    """Stores and job buses on the test's Redis, closed when the test ends (tests/support/stores.py)."""
    made = Stores()
    try:
        yield made
    finally:
        await made.aclose()
