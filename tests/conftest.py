"""Fixtures with real parts: a real redis-server, real gateway and worker processes."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.processes import Proc, start_gateway, start_worker
from voxroom.store.server import RedisServer


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
