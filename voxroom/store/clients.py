"""The Redis clients voxroom's processes use: redis-py's asyncio client, with one cost removed.

redis-py (8.x) gives every connection a 5 s socket timeout and enforces it on each write with
``asyncio.wait_for``, which on Python 3.11 wraps the write in a new Task: a Task created and
scheduled per command, on the hot path of every slice a worker publishes and every line a gateway
accepts. Here the same timeout is enforced with ``asyncio.timeout`` (a timer on the current task,
no new Task); reads keep redis-py's own timeout. From Python 3.12 ``wait_for`` is built on
``asyncio.timeout`` itself and the connections are redis-py's, unchanged.

Also here: whether ``REDIS_URL`` names a node of a Redis Cluster (:func:`cluster_enabled`), and
the one cluster client every cluster-mode component takes (:func:`cluster_client`,
:func:`cluster_from_url`; docs/cluster.md): a process decides once, at start, which of the two
kinds it builds.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import redis
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError


class _TimedWrites:
    """Mixed in front of redis-py's connection classes (plain TCP, TLS, unix socket)."""

    socket_timeout: float | None

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        timeout = self.socket_timeout
        parent: Any = super()
        if not timeout:
            await parent.send_packed_command(command, check_health)
            return
        # With no socket timeout redis-py writes without wait_for; the timer below stands for it.
        self.socket_timeout = None
        try:
            async with asyncio.timeout(timeout):
                await parent.send_packed_command(command, check_health)
        except TimeoutError:
            await parent.disconnect(nowait=True)
            raise RedisTimeoutError("Timeout writing to socket") from None
        finally:
            self.socket_timeout = timeout


_classes: dict[type[AbstractConnection], type[AbstractConnection]] = {}


def _timed(cls: type[AbstractConnection]) -> type[AbstractConnection]:
    if issubclass(cls, _TimedWrites):
        return cls
    if cls not in _classes:
        _classes[cls] = type(f"TimedWrites{cls.__name__}", (_TimedWrites, cls), {})
    return _classes[cls]


POOL_MAX_CONNECTIONS = 256
POOL_WAIT_S = 10.0


def from_url(url: str, *, max_connections: int = POOL_MAX_CONNECTIONS, pool_wait_s: float = POOL_WAIT_S,
             **options: Any) -> Redis:
    """``Redis.from_url`` (same URL schemes and options), with writes timed as above, on a
    *blocking* pool: at ``max_connections`` commands in flight the next one waits up to
    ``pool_wait_s`` for a connection instead of failing. redis-py's default pool (100 at most,
    since 8.x) raises ``MaxConnectionsError`` on the 101st: a gateway whose clients joined while
    a hundred others left failed those joins before this."""
    pool = BlockingConnectionPool.from_url(url, max_connections=max_connections, timeout=pool_wait_s, **options)
    client = Redis.from_pool(pool)
    if sys.version_info < (3, 12):
        client.connection_pool.connection_class = _timed(client.connection_pool.connection_class)
    return client


CLUSTER_SOCKET_TIMEOUT_S = 10.0
"""Reply timeout of a cluster client's commands: longer than any blocked read sent through
redis-py's own routing (the reads of ``voxroom/store/cluster/slots.py`` set their own)."""


def cluster_client(url: str, **options: Any) -> RedisCluster:
    """redis-py's ``RedisCluster`` for the cluster ``url`` names one node of; its slot map is read
    (``CLUSTER SLOTS``) on first use. RESP2, as the single-instance clients and the autopipeline
    speak: raw replies keep one shape. Same URL schemes and options as :func:`from_url`.

    ``reinitialize_steps=0``: redis-py (8.1) counts the ``MOVED`` replies its ``execute_command``
    gets and on every ``reinitialize_steps``-th one (default 5) calls ``RedisCluster.aclose()``,
    which disconnects every connection of every node, commands in flight included: a reshard
    then failed the gateway hub's blocked room reads ("Connection closed by server"). With 0 a
    ``MOVED`` only re-points its slot at the node it names (``NodesManager.move_slot``, no
    connection closed); the whole map is still read again after a connection error and by
    ``ClusterReads.refresh``, whose ``NodesManager.initialize`` recycles connections lazily, once
    their command is answered. There is no value that refreshes the whole map on ``MOVED``
    without the ``aclose()``."""
    return RedisCluster.from_url(url, **{"protocol": 2, "socket_timeout": CLUSTER_SOCKET_TIMEOUT_S,
                                         "reinitialize_steps": 0, **options})


async def cluster_from_url(url: str, **options: Any) -> RedisCluster:
    """:func:`cluster_client`, its slot map read before it is returned (a cluster that cannot be
    reached raises here, at start)."""
    client = cluster_client(url, **options)
    await client.initialize()
    return client


def cluster_enabled(url: str, *, timeout_s: float = 5.0) -> bool | None:
    """Whether the Redis at ``url`` runs in cluster mode (``INFO cluster`` says
    ``cluster_enabled:1``). ``None`` when it cannot be asked now (unreachable, loading): the
    caller starts as it would have, and its own retries wait for Redis. A server that refuses
    ``INFO`` (some managed offerings rename it) counts as not a cluster."""
    try:
        with redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s) as r:
            info: Any = r.info("cluster")
    except ResponseError as exc:
        if "LOADING" in str(exc):
            return None
        return False
    except RedisError:
        return None
    return bool(int(info.get("cluster_enabled", 0)))
