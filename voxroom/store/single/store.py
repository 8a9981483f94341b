"""The store on one Redis (or a primary with replicas): what ``open_store`` returns when
``REDIS_URL`` does not name a cluster node."""

from __future__ import annotations

import asyncio

from voxroom.runtime.supervisor import Supervisor
from voxroom.store import clients, keys
from voxroom.store.autopipe import AutoPipeline
from voxroom.store.backoff import READ_DEADLINE_S
from voxroom.store.interface import SAY_HOLD_S, Commands, FanoutEvents, IngressOptions, Loop
from voxroom.store.jobs import FencedJobBus
from voxroom.store.single.fanout import SingleFanout
from voxroom.store.single.ingress import SingleIngress
from voxroom.store.single.jobs import SingleJobQueue
from voxroom.store.single.watcher import SingleWatcher

PING_TIMEOUT_S = 1.5
"""``/readyz`` answers within its load balancer's timeout even when Redis is cut off."""
READ_TIMEOUT_S = 2.0 + READ_DEADLINE_S
"""Reply timeout of the worker's job reads (a read blocks for at most 2 s, workers/intake/worker.py
``READ_BLOCK_MS``): a read on a dead connection is given up a second after its block."""


class SingleLayout:
    """One ``vx:rooms``, one ``vx:jobs``."""

    def room_index(self, room: str) -> str:
        return keys.ROOMS

    def room_indexes(self) -> list[str]:
        return [keys.ROOMS]

    def job_streams(self) -> list[str]:
        return [keys.JOBS]

    def job_stream_of(self, room: str) -> str:
        return keys.JOBS


class SingleStore:
    """Two redis-py clients (text and bytes) whose connection settings every pipeline opens its
    own connection from; the clients' pools serve only what is not pipelined (``PING``)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.layout = SingleLayout()
        self._text = clients.from_url(url, decode_responses=True)
        self._raw = clients.from_url(url, decode_responses=False)

    def commands(self, *, decode: bool = True, timeout_s: float = 5.0,
                 max_hold_s: float | None = None) -> AutoPipeline:
        return AutoPipeline(self._text if decode else self._raw, timeout_s=timeout_s, max_hold_s=max_hold_s)

    def slot_of(self, key: str) -> int:
        return 0

    async def ping(self) -> None:
        async with asyncio.timeout(PING_TIMEOUT_S):
            await self._text.ping()

    def ingress(self, options: IngressOptions) -> SingleIngress:
        return SingleIngress(self.commands(max_hold_s=SAY_HOLD_S), options)

    def fanout(self, control: Commands, supervisor: Supervisor, gateway_id: str, events: FanoutEvents, *,
               rooms_per_reader: int = 200) -> SingleFanout:
        return SingleFanout(self._raw, control, supervisor, gateway_id, events, rooms_per_reader=rooms_per_reader)

    def watcher(self, wake_key: str, control: Commands) -> SingleWatcher:
        return SingleWatcher(self._raw, control, wake_key)

    def gateway_loops(self, gateway_id: str, *, room_idle_ttl_s: int) -> dict[str, Loop]:
        return {}

    def job_bus(self, consumer: str, *, resume_window_ms: int = 120_000, room_idle_ttl_s: int = 3600) -> FencedJobBus:
        auto = self.commands()
        queue = SingleJobQueue(auto, self.commands(timeout_s=READ_TIMEOUT_S), consumer)
        return FencedJobBus(queue, auto, self.commands(decode=False), self.watcher(keys.worker_wake(consumer), auto),
                      self.slot_of, resume_window_ms=resume_window_ms, room_idle_ttl_s=room_idle_ttl_s)

    async def aclose(self) -> None:
        await self._text.aclose()
        await self._raw.aclose()
