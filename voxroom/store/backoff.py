"""Capped exponential backoff for the loops that must outlive a Redis outage (hub readers, the
worker's job reader, every supervised loop): 0.1 s doubling to 5 s, back to 0.1 s after a success.

:data:`REDIS_DOWN` is the one class of "Redis cannot serve us right now, back off and retry",
whichever client raised it (redis-py, or ``voxroom/store/autopipe.py`` which maps error replies to the
same classes): a lost connection, a timeout, a Redis still loading its AOF (``-LOADING``,
redis-py's ``BusyLoadingError``), out of memory (``-OOM``), a replica that cannot take writes
(``-READONLY``) or a primary that is down (``-MASTERDOWN``, ``-CLUSTERDOWN``, ``-TRYAGAIN``).
"""

from __future__ import annotations

import asyncio

from redis.exceptions import ClusterDownError, OutOfMemoryError, ReadOnlyError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

REDIS_DOWN: tuple[type[BaseException], ...] = (
    RedisConnectionError, RedisTimeoutError, OSError, OutOfMemoryError, ReadOnlyError, ClusterDownError,
    TryAgainError)
"""What an unavailable Redis raises (``BusyLoadingError`` is a ``ConnectionError``;
``MasterDownError`` a ``ClusterDownError``): caught by retry loops, nothing else is."""


READ_DEADLINE_S = 1.0
"""A blocked read's reply is awaited this long past its ``BLOCK`` (and a command's past nothing)
before its connection counts as dead (``voxroom/store/autopipe.py`` then reads once more for
``GRACE_READ_S``). A connection whose packets are dropped (a partition, no RST) is given up within
seconds, never after a long socket timeout: the read starts again on a new connection at once."""

CONNECT_TIMEOUT_S = 1.0
"""A new connection to Redis that has not completed in this long fails (and is tried again): on a
partition the SYN is dropped, and a longer wait would only delay the first read after the heal."""

RECONNECT_CAP_S = 1.0
"""The longest pause of the loops that block on a read (the hub's readers, the stream watchers, the
worker's intake) between two tries while Redis is unavailable: with :data:`CONNECT_TIMEOUT_S` a
healed partition is read again within about two seconds (docs/reliability.md)."""


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
