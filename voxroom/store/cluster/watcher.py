"""Waiting for a room's output stream to move, on a Redis Cluster: a blocked ``XREAD`` per waiter.

A cluster refuses a command whose keys lie in more than one slot (``CROSSSLOT``), even when one
node holds all of them, so the single instance's one ``XREAD`` over many rooms plus a wake stream
(``voxroom/store/single/watcher.py``) becomes a blocked ``XREAD`` of its own per waiter, on a
pooled connection to the room's node (``voxroom/store/cluster/slots.py``: ``MOVED``, ``ASK`` and
failovers followed). :meth:`ClusterWatcher.run` has nothing to do, and there is no wake stream.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from voxroom.store import keys
from voxroom.store.backoff import REDIS_DOWN, Backoff
from voxroom.store.cluster.slots import ClusterReads

log = logging.getLogger("voxroom.watcher")

BLOCK_MS = 2000
"""Longest blocked read of one waiter (a longer wait reads again)."""


class ClusterWatcher:
    """:class:`voxroom.store.interface.StreamWatch` on a cluster. ``reads``: over a bytes client."""

    def __init__(self, reads: ClusterReads) -> None:
        self._reads = reads
        self.reads = 0

    async def wait(self, room: str, after_id: str, timeout_s: float) -> str:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while (left := deadline - loop.time()) > 0:
            try:
                self.reads += 1
                resp: Any = await self._reads.xread(keys.room_output(room), after_id, count=1,
                                                    block_ms=max(1, int(min(left, BLOCK_MS / 1000) * 1000)))
            except REDIS_DOWN as exc:
                # The waiter checks for itself, never past its timeout.
                log.debug("stream watcher: redis unavailable (%s)", exc)
                await asyncio.sleep(min(Backoff().delay, max(0.0, deadline - loop.time())))
                return after_id
            for _name, entries in resp or []:
                if entries:
                    return bytes(entries[-1][0]).decode()
        return after_id

    async def run(self) -> None:
        await asyncio.Event().wait()  # each waiter reads for itself

    async def aclose(self) -> None:
        return None
