"""The store (voxroom/store/) opened on a test's own redis-server or cluster, and job buses on it
with their turn watcher running, all closed when the test ends (the ``stores`` fixture)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from voxroom.store.interface import Commands, Ingress, IngressOptions, Store
from voxroom.store.jobs import FencedJobBus
from voxroom.store.opening import open_store


def url_of(where: str | Redis | RedisCluster) -> str:
    """A Redis URL for a URL or a redis-py client (its first node, for a cluster client)."""
    if isinstance(where, str):
        return where
    if isinstance(where, RedisCluster):
        node = where.get_default_node() or where.get_nodes()[0]
        return f"redis://{node.host}:{node.port}"
    kw = where.connection_pool.connection_kwargs
    if kw.get("path"):
        return f"unix://{kw['path']}"
    return f"redis://{kw.get('host', '127.0.0.1')}:{kw.get('port', 6379)}/{kw.get('db', 0)}"


class Stores:
    """Opens stores and buses for one test; :meth:`aclose` closes them all, buses first."""

    def __init__(self) -> None:
        self._stores: dict[tuple[str, int], Store] = {}
        self._buses: list[tuple[FencedJobBus, asyncio.Task[None]]] = []
        self._ingresses: list[Ingress] = []

    async def open(self, where: str | Redis | RedisCluster, *, job_shards: int = 12) -> Store:
        url = url_of(where)
        store = self._stores.get((url, job_shards))
        if store is None:
            store = self._stores[url, job_shards] = await open_store(url, job_shards=job_shards, connect=True)
        return store

    async def bus(self, where: str | Redis | RedisCluster, consumer: str, *, job_shards: int = 12,
                  **options: Any) -> FencedJobBus:
        """A worker's job bus for ``consumer`` (``resume_window_ms``, ``room_idle_ttl_s``), its
        watcher's loop running as a worker runs it."""
        store = await self.open(where, job_shards=job_shards)
        bus = store.job_bus(consumer, **options)
        self._buses.append((bus, asyncio.create_task(bus.watcher.run(), name=f"test:{consumer}:turns")))
        return bus

    async def cache_pipes(self, where: str | Redis | RedisCluster) -> tuple[Commands, Commands]:
        """The two pipelines an ``AudioCache`` takes (lookups, stores; bytes replies): the cache
        closes them."""
        store = await self.open(where)
        return store.commands(decode=False), store.commands(decode=False)

    async def ingress(self, where: str | Redis | RedisCluster, *, job_shards: int = 12, **options: Any) -> Ingress:
        """The gateway's ingress (``IngressOptions`` by keyword: ``switch_lines=1``...)."""
        store = await self.open(where, job_shards=job_shards)
        ingress = store.ingress(IngressOptions(**options))
        self._ingresses.append(ingress)
        return ingress

    async def aclose(self) -> None:
        ingresses, self._ingresses = self._ingresses, []
        for ingress in ingresses:
            await ingress.aclose()
        buses, self._buses = self._buses, []
        for bus, task in buses:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await bus.close()
        stores, self._stores = list(self._stores.values()), {}
        for store in stores:
            await store.aclose()
