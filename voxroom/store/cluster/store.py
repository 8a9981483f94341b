"""The store on a Redis Cluster (docs/cluster.md): what ``open_store`` returns when ``REDIS_URL``
names a node of one. Every command goes to the node of its key's slot; one slot map refresh
(single-flight, ``ClusterReads.refresh``) serves every path of one client."""

from __future__ import annotations

import asyncio

from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from voxroom.runtime.supervisor import Supervisor
from voxroom.store import clients, keys
from voxroom.store.backoff import READ_DEADLINE_S
from voxroom.store.cluster.calls import ClusterCalls
from voxroom.store.cluster.fanout import ClusterFanout
from voxroom.store.cluster.ingress import ClusterIngress
from voxroom.store.cluster.jobs import ClusterJobQueue
from voxroom.store.cluster.pipeline import ClusterAutoPipeline
from voxroom.store.cluster.slots import ClusterReads
from voxroom.store.cluster.sweeper import Sweeper
from voxroom.store.cluster.watcher import ClusterWatcher
from voxroom.store.interface import SAY_HOLD_S, Commands, FanoutEvents, IngressOptions, Loop
from voxroom.store.jobs import FencedJobBus

PING_TIMEOUT_S = 1.5
BLOCKED_READ_TIMEOUT_S = 2.0 + READ_DEADLINE_S
"""The socket timeout of the job shards' blocked reads (at most 2 s each): a dead node's read is
given up a second after its block."""


class ClusterLayout:
    """``job_shards`` index shards ``vx:rooms:{rK}`` and job shards ``vx:jobs:{jK}``; a room's
    shard is the CRC16 of its id (``keys.shard_of``)."""

    def __init__(self, shards: int) -> None:
        if shards < 1:
            raise ValueError(f"job_shards must be at least 1, not {shards}")
        self.shards = shards

    def room_index(self, room: str) -> str:
        return keys.rooms_shard(keys.shard_of(room, self.shards), self.shards)

    def room_indexes(self) -> list[str]:
        return [keys.rooms_shard(k, self.shards) for k in range(self.shards)]

    def job_streams(self) -> list[str]:
        return [keys.job_shard(k, self.shards) for k in range(self.shards)]

    def job_stream_of(self, room: str) -> str:
        return keys.job_shard(keys.shard_of(room, self.shards), self.shards)


class ClusterStore:
    """Two redis-py cluster clients (text and bytes): their slot maps and per-node settings; the
    pipelines open their own connection to each node they send to."""

    def __init__(self, url: str, *, job_shards: int) -> None:
        self.url = url
        self.layout = ClusterLayout(job_shards)
        self._text = clients.cluster_client(url, decode_responses=True)
        self._raw = clients.cluster_client(url, decode_responses=False)
        self._text_reads = ClusterReads(self._text)
        self._raw_reads = ClusterReads(self._raw)
        self._owned: list[ClusterAutoPipeline] = []
        """Pipelines of the store's own loops (the sweeper's), closed with the store."""

    async def connect(self) -> None:
        """Read both slot maps now (a cluster that cannot be reached raises here)."""
        await self._text.initialize()
        await self._raw.initialize()

    def commands(self, *, decode: bool = True, timeout_s: float = 5.0,
                 max_hold_s: float | None = None) -> ClusterAutoPipeline:
        client, reads = (self._text, self._text_reads) if decode else (self._raw, self._raw_reads)
        return ClusterAutoPipeline(client, reads=reads, timeout_s=timeout_s, max_hold_s=max_hold_s)

    def slot_of(self, key: str) -> int:
        return int(key_slot(key.encode()))

    async def ping(self) -> None:
        """Any one node answering is enough: a primary failing over takes out its own rooms, not
        the gateway (``/readyz`` must not send every gateway out of its load balancer for it)."""
        async with asyncio.timeout(PING_TIMEOUT_S):
            await self._text.ping(target_nodes=RedisCluster.RANDOM)

    def ingress(self, options: IngressOptions) -> ClusterIngress:
        return ClusterIngress(self.commands(max_hold_s=SAY_HOLD_S), options, shards=self.layout.shards)

    def fanout(self, control: Commands, supervisor: Supervisor, gateway_id: str, events: FanoutEvents, *,
               rooms_per_reader: int = 200) -> ClusterFanout:
        # No readers of many rooms here: every room is read when its bell rings (one subscriber
        # connection per primary, whatever the number of rooms), so rooms_per_reader has no use.
        return ClusterFanout(self._raw, self._raw_reads, control, supervisor, events)

    def watcher(self, wake_key: str, control: Commands) -> ClusterWatcher:
        return ClusterWatcher(self._raw_reads)

    def gateway_loops(self, gateway_id: str, *, room_idle_ttl_s: int) -> dict[str, Loop]:
        pipe = self.commands()
        self._owned.append(pipe)
        ingress = ClusterIngress(pipe, IngressOptions(room_idle_ttl_s=room_idle_ttl_s), shards=self.layout.shards)
        return {"gateway:sweeper": Sweeper(ingress, gateway_id, room_idle_ttl_s=room_idle_ttl_s).run}

    def job_bus(self, consumer: str, *, resume_window_ms: int = 120_000, room_idle_ttl_s: int = 3600) -> FencedJobBus:
        auto = self.commands()
        # The blocked shard reads on redis-py's pools of a client of their own (the queue closes it).
        blocking = ClusterCalls(clients.cluster_client(self.url, decode_responses=True,
                                                       socket_timeout=BLOCKED_READ_TIMEOUT_S))
        queue = ClusterJobQueue(auto, blocking, consumer, shards=self.layout.shards, room_idle_ttl_s=room_idle_ttl_s)
        return FencedJobBus(queue, auto, self.commands(decode=False), self.watcher(keys.worker_wake(consumer), auto),
                      self.slot_of, resume_window_ms=resume_window_ms, room_idle_ttl_s=room_idle_ttl_s)

    async def aclose(self) -> None:
        owned, self._owned = self._owned, []
        await asyncio.gather(*(pipe.aclose() for pipe in owned), return_exceptions=True)
        await self._text.aclose()
        await self._raw.aclose()
