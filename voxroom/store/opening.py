"""Where the store is opened, and the one place the Redis mode is decided: ``REDIS_URL`` names a
node of a Redis Cluster (``INFO cluster`` says ``cluster_enabled:1``) or one Redis. Everything
above gets a :class:`~voxroom.store.interface.Store` (or, for the CLI's look at rooms, a
:class:`~voxroom.store.inspection.RoomInspection`) and never asks which."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import TypeVar

import redis
from redis.cluster import RedisCluster

from voxroom.store import clients
from voxroom.store.cluster.store import ClusterLayout, ClusterStore
from voxroom.store.inspection import RoomInspection
from voxroom.store.interface import Store
from voxroom.store.single.store import SingleLayout, SingleStore

DEFAULT_URL = "redis://127.0.0.1:6379/0"
T = TypeVar("T")
INSPECTION_TIMEOUT_S = 5.0


async def open_store(url: str | None, *, job_shards: int = 12, connect: bool = False) -> Store:
    """The store for ``url`` (``None``: :data:`DEFAULT_URL`). ``job_shards``: the deployment's
    ``VOXROOM_JOB_SHARDS`` (a cluster's). ``connect``: on a cluster, read the slot map now, so that
    an unreachable cluster fails the start (a gateway) rather than its first requests; a worker
    waits for Redis patiently instead. A Redis that cannot be asked now counts as one instance, as
    it always did: its own retries wait for it."""
    url = url or DEFAULT_URL
    if await _on_daemon_thread(clients.cluster_enabled, url):
        store = ClusterStore(url, job_shards=job_shards)
        if connect:
            await store.connect()
        return store
    return SingleStore(url)


async def _on_daemon_thread(fn: Callable[[str], T], arg: str) -> T:
    """``fn(arg)`` (a blocking probe with its own timeout) on a daemon thread: a process stopping
    meanwhile (a worker asked to stop while Redis does not answer) walks away from it instead of
    joining it at exit, as the default executor's threads are."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, exc: BaseException | None) -> None:
        if future.done():
            return  # the caller stopped waiting
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def run() -> None:
        try:
            result = fn(arg)
        except BaseException as exc:  # handed to the awaiting coroutine, raised there
            loop.call_soon_threadsafe(settle, None, exc)
        else:
            loop.call_soon_threadsafe(settle, result, None)

    threading.Thread(target=run, name="vx-probe:redis-mode", daemon=True).start()
    return await future


def open_inspection(url: str | None, *, job_shards: int = 12) -> RoomInspection:
    """A synchronous, read-only look at rooms for the CLI (``voxroom rooms``, ``voxroom room``):
    on a cluster redis-py's cluster client routes each read to its key's node."""
    url = url or DEFAULT_URL
    if clients.cluster_enabled(url):
        return RoomInspection(RedisCluster.from_url(url, socket_timeout=INSPECTION_TIMEOUT_S),
                              ClusterLayout(job_shards))
    return RoomInspection(redis.Redis.from_url(url, socket_timeout=INSPECTION_TIMEOUT_S), SingleLayout())
