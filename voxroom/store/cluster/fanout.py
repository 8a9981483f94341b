"""The gateway hub's reads of its rooms on a Redis Cluster: a bell says when, a non-blocking
``XREAD`` reads, on the per-node autopipeline.

A room's bell (``voxroom/store/cluster/bells.py``) rings when a worker's script appended to its
``:out``, and once after every (re)subscribe. A ring reads the room: ``XREAD COUNT n STREAMS
key cursor``, no ``BLOCK``, through the hub's ``control`` (``ClusterAutoPipeline``: one
connection per node, every read of one loop turn in one round trip per node, ``MOVED``/``ASK``
followed). Reads are coalesced per room: at most one in flight; a ring during it makes one more
read after it; a read that returns a full ``COUNT`` is followed by the next at once.

**The sweep** (:meth:`ClusterFanout.sweep`, every ``sweep_s``, 2 s): every room held is read
once, pipelined. It bounds what a lost bell costs to those 2 s, the bound the blocked reads had:
a bell rung on a migrating slot's target (a script sent there after ``ASK``, while the gateway
listens on the source) or during a reconnect; and a read that failed (Redis unavailable).

Each room's cursor is kept here and moved with no await before its entries are delivered
(``voxroom.store.interface.Deliver``); a read whose cursor moved meanwhile (the room left and
joined again) is dropped and read again.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from redis.asyncio.cluster import RedisCluster

from voxroom.runtime.supervisor import Supervisor
from voxroom.store import keys
from voxroom.store.backoff import REDIS_DOWN
from voxroom.store.cluster.bells import ClusterBells
from voxroom.store.cluster.slots import ClusterReads
from voxroom.store.entry_ids import entry_id_str
from voxroom.store.interface import Commands, FanoutEvents

log = logging.getLogger("voxroom.gateway.hub")

SWEEP_LOOP = "hub:sweep"
READ_COUNT = 512
SWEEP_S = 2.0
"""Every room held is read this often besides its bells (the bound a lost bell costs)."""


class ClusterFanout:
    """:class:`voxroom.store.interface.FanoutSource` on a cluster: each room read when its bell
    rings and at every sweep. ``control``: the hub's per-node autopipeline (bytes replies)."""

    def __init__(self, cluster: RedisCluster, reads: ClusterReads, control: Commands, supervisor: Supervisor,
                 events: FanoutEvents, *, count: int = READ_COUNT, sweep_s: float = SWEEP_S) -> None:
        self.control = control
        self.supervisor = supervisor
        self.cursors: dict[str, str] = {}
        """Room -> id of the last entry delivered (or its tail when added)."""
        self.count = count
        self.sweep_s = sweep_s
        self.events = events
        self._cut_off: set[str] = set()
        """Rooms whose last read failed (Redis unreachable from here): their next read is a backlog."""
        self.bells = ClusterBells(cluster, reads, supervisor, self.ring)
        self._reading: dict[str, asyncio.Task[None]] = {}
        """Room -> its read in flight (at most one)."""
        self._again: set[str] = set()
        """Rooms rung while their read was in flight: read once more after it."""
        self._cancelled: set[asyncio.Task[None]] = set()
        self._sweeping = False
        self.reads = 0

    def cursor(self, room: str) -> str | None:
        return self.cursors.get(room)

    async def add(self, room: str, cursor: str) -> None:
        """Start hearing ``room``: its read follows the bell's subscribe."""
        self.cursors[room] = cursor
        if not self._sweeping:
            self._sweeping = True
            self.supervisor.spawn(SWEEP_LOOP, self.sweep)
        self.bells.add(room)

    async def remove(self, room: str) -> None:
        """Stop hearing ``room``; its read in flight is cancelled, nothing of it is kept."""
        self.cursors.pop(room, None)
        self._cut_off.discard(room)
        self.bells.remove(room)
        self._again.discard(room)
        task = self._reading.pop(room, None)
        if task is not None:
            task.cancel()
            self._cancelled.add(task)  # kept until it has ended
            task.add_done_callback(self._cancelled.discard)

    def ring(self, room: str) -> None:
        if room not in self.cursors:
            return
        if room in self._reading:
            self._again.add(room)
            return
        self._reading[room] = asyncio.create_task(self._read(room), name=f"room:{room}:hub-read")

    async def _read(self, room: str) -> None:
        key = keys.room_output(room)
        try:
            while True:
                self._again.discard(room)
                cursor = self.cursors.get(room)
                if cursor is None:
                    return
                resp: Any = await self.control.call("XREAD", "COUNT", self.count, "STREAMS", key, cursor)
                self.reads += 1
                self.events.reachable()
                if self.cursors.get(room) != cursor:
                    continue  # the room left (and maybe joined again) meanwhile: from its cursor now
                full = False
                if resp:
                    for _stream, entries in resp:
                        if entries:
                            if room in self._cut_off:
                                # Waited in Redis while this gateway could not read the room: the
                                # hub replays them to each client at its own pace first.
                                self.events.resync(room, cursor)
                            self.cursors[room] = entry_id_str(entries[-1][0])
                            self.events.deliver(room, entries)
                        full = len(entries) >= self.count
                    self.events.pulse()
                self._cut_off.discard(room)
                if not full and room not in self._again:
                    return
        except REDIS_DOWN as exc:  # the sweep reads it again
            log.debug("room %s not read (%s); the sweep reads it again", room, exc)
            if room in self.cursors:
                self._cut_off.add(room)
            self.events.unreachable(exc)
        except Exception:
            log.exception("reading room %s failed; the sweep reads it again", room)
        finally:
            # No await between the last check of ``_again`` and this: a ring after it starts a read.
            if self._reading.get(room) is asyncio.current_task():
                del self._reading[room]

    async def sweep(self) -> None:
        """Every ``sweep_s``, ring every room held (their reads pipelined per node)."""
        while True:
            await asyncio.sleep(self.sweep_s)
            for room in list(self.cursors):
                self.ring(room)

    async def aclose(self) -> None:
        if self._sweeping:
            await self.supervisor.stop(SWEEP_LOOP)
            self._sweeping = False
        await self.bells.aclose()
        tasks = [*self._reading.values(), *self._cancelled]
        self._reading.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
