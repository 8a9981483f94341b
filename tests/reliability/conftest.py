"""Fixtures of the reliability tests that run their own processes: a Redis of the test's own (faults
and key counts must not see other tests' rooms), and clients on it (text and raw bytes)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio import Redis

from voxroom.store import clients as redis_client
from voxroom.store.server import RedisServer


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
async def r(own_redis: RedisServer) -> AsyncIterator[Redis]:
    client = redis_client.from_url(own_redis.url, decode_responses=True)
    yield client
    await client.aclose()


@pytest.fixture
async def raw(own_redis: RedisServer) -> AsyncIterator[Redis]:
    client = redis_client.from_url(own_redis.url)
    yield client
    await client.aclose()
