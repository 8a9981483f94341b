"""Real parts for the operations tests: a private redis-server, a synthetic worker, a gateway.

The Redis is private to this package (not the session one the e2e tests share): the synthetic
worker speaks every voice, and on a shared job stream it would take the e2e tests' utterances.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.processes import Proc, start_gateway, start_worker
from voxroom.store.server import RedisServer

ENGINE_TTFC_MS = 50  # the synthetic engine's default


@dataclass
class OpsStack:
    redis_url: str
    worker: Proc
    gateways: list[tuple[Proc, int]]
    logs: Path

    @property
    def port(self) -> int:
        return self.gateways[0][1]


@pytest.fixture(scope="package")
def ops_redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="package")
def ops_stack(ops_redis: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpsStack]:
    """Two gateways and one synthetic worker (four contexts) on the package's Redis."""
    logs = tmp_path_factory.mktemp("ops-logs")
    worker = start_worker(ops_redis.url, logs, engine="synthetic", contexts=4, VOXROOM_CONTEXT_INFLIGHT="4")
    gateways = []
    try:
        gateways = [start_gateway(ops_redis.url, logs), start_gateway(ops_redis.url, logs)]
        yield OpsStack(ops_redis.url, worker, gateways, logs)
    finally:
        for proc, _ in gateways:
            proc.stop()
        worker.stop()
