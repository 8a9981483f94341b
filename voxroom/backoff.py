"""Capped exponential backoff for the loops that must outlive a Redis outage (hub readers, the
worker's job reader): 0.1 s doubling to 5 s, back to 0.1 s after a success."""

from __future__ import annotations

import asyncio

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

REDIS_DOWN = (RedisConnectionError, RedisTimeoutError, OSError)
"""What a Redis outage raises in redis-py: caught by retry loops, nothing else is."""


class Backoff:
    __slots__ = ("cap", "delay", "first")

    def __init__(self, first: float = 0.1, cap: float = 5.0) -> None:
        self.first = first
        self.cap = cap
        self.delay = first

    def reset(self) -> None:
        self.delay = self.first

    async def wait(self) -> None:
        """Sleep the current delay, then double it (up to the cap)."""
        await asyncio.sleep(self.delay)
        self.delay = min(self.delay * 2, self.cap)
