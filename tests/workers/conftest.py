"""In-process worker tests against a real redis-server: one server per test module, flushed before
each test that takes ``r``; ``raw`` reads bytes (output entries carry audio)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio import Redis

from voxroom.store import clients as redis_client
from voxroom.store.server import RedisServer


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as srv:
        yield srv


@pytest.fixture
async def r(server: RedisServer) -> AsyncIterator[Redis]:
    client = redis_client.from_url(server.url, decode_responses=True)
    await client.flushall()
    yield client
    await client.aclose()


@pytest.fixture
async def raw(server: RedisServer) -> AsyncIterator[Redis]:
    client = redis_client.from_url(server.url)
    yield client
    await client.aclose()
