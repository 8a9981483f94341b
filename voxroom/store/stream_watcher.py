"""One blocked ``XREAD`` for every "wait until this room's output stream moves" in a process.

A worker's utterances wait for their room's turn through it; a gateway's ``POST
/v1/audio/speech`` responses wait for their private room's next slices through it. The gateway's
room fan-out (``app/fanout/hub.py``) reads the same way, with its own readers (it dispatches every entry
to clients; this only says *that* a stream moved, and the waiter reads what it wants).


An utterance whose room is still playing an earlier line waits until the room's output stream
moves (every turn handover comes with an ``end`` entry there). Before, each waiting utterance held
a pooled connection in a blocking ``XREAD`` of its own: up to 256 from a pool, on a host that can
hold 8 x 64 utterances, and a connection taken per wait. Now one loop (supervised as ``turns``)
holds one blocked ``XREAD`` over the output streams of the rooms that have a waiter, plus a private
wake stream: a waiter for a room the read does not cover yet ``XADD``s to it, so the read starts
again with the new room at once (the gateway's hub does the same for its rooms).

Redis unavailable: the loop backs off, and wakes every waiter, which checks the turn itself (a
waiter never sleeps past its own timeout either way).

On a Redis Cluster (``raw`` a ``RedisCluster``) rooms lie in different slots and one ``XREAD``
cannot span slots (``CROSSSLOT``): each waiter holds a blocked ``XREAD`` of its room's stream on
its node instead (``voxroom/store/cluster/slots.py``: ``MOVED``, ``ASK`` and failovers followed), and
:meth:`StreamWatcher.run` has nothing to do.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from voxroom.store import keys
from voxroom.store.autopipe import AutoPipeline, Commands
from voxroom.store.backoff import REDIS_DOWN, Backoff
from voxroom.store.cluster.slots import ClusterReads

log = logging.getLogger("voxroom.watcher")

BLOCK_MS = 5000
"""Longest blocked read; a new waiter's room interrupts it through the wake stream."""
WAKE_TTL_S = 3600


def _id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


class _Waiter:
    __slots__ = ("after", "event", "tail")

    def __init__(self, after: str) -> None:
        self.after = after
        self.event = asyncio.Event()
        self.tail = after


class StreamWatcher:
    """``raw`` must not decode responses (output entries carry audio); ``commands`` is the
    pipeline that sends the wake ``XADD`` (never the blocked connection itself)."""

    def __init__(self, raw: Redis | RedisCluster, commands: Commands, wake_key: str) -> None:
        self._cluster = ClusterReads(raw) if isinstance(raw, RedisCluster) else None
        self._read = AutoPipeline(raw, timeout_s=BLOCK_MS / 1000 + 25) if isinstance(raw, Redis) else None
        self._commands = commands
        self.wake_key = wake_key
        self._waiters: dict[str, list[_Waiter]] = {}
        self._reading: dict[str, tuple[int, int]] = {}
        """What the read in flight covers: room -> the id it reads after."""
        self._wake_last = "0-0"
        self.reads = 0

    async def wait(self, room: str, after_id: str, timeout_s: float) -> str:
        """Return once the room's output stream has an entry after ``after_id`` (its id), or
        ``after_id`` after ``timeout_s``."""
        if self._cluster is not None:
            return await self._wait_cluster(self._cluster, room, after_id, timeout_s)
        waiter = _Waiter(after_id)
        self._waiters.setdefault(room, []).append(waiter)
        try:
            covered = self._reading.get(room)
            if covered is None or covered > _id(after_id):
                await self._wake()
            try:
                await asyncio.wait_for(waiter.event.wait(), timeout_s)
            except TimeoutError:
                pass
            return waiter.tail
        finally:
            waiters = self._waiters.get(room)
            if waiters is not None:
                if waiter in waiters:
                    waiters.remove(waiter)
                if not waiters:
                    del self._waiters[room]

    async def _wait_cluster(self, reads: ClusterReads, room: str, after_id: str, timeout_s: float) -> str:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while (left := deadline - loop.time()) > 0:
            try:
                self.reads += 1
                resp: Any = await reads.xread(keys.room_output(room), after_id, count=1,
                                              block_ms=max(1, int(min(left, BLOCK_MS / 1000) * 1000)))
            except REDIS_DOWN as exc:
                # As the loop below: the waiter checks the turn itself, never past its timeout.
                log.debug("stream watcher: redis unavailable (%s)", exc)
                await asyncio.sleep(min(Backoff().delay, max(0.0, deadline - loop.time())))
                return after_id
            for _name, entries in resp or []:
                if entries:
                    return bytes(entries[-1][0]).decode()
        return after_id

    async def _wake(self) -> None:
        try:
            await self._commands.group([("XADD", self.wake_key, "MAXLEN", "~", 16, "*", "w", 1),
                                        ("EXPIRE", self.wake_key, WAKE_TTL_S)])
        except REDIS_DOWN as exc:
            # The read is down too, or about to be: it wakes everyone when it fails.
            log.debug("stream watcher: wake failed: %s", exc)

    async def run(self) -> None:
        """The loop (its process runs it under its supervisor)."""
        if self._read is None:  # on a cluster each waiter reads for itself
            await asyncio.Event().wait()
            return
        backoff = Backoff()
        while True:
            rooms = {room: min((w.after for w in waiters), key=_id) for room, waiters in self._waiters.items()}
            streams = {keys.room_output(room): room for room in rooms}
            self._reading = {room: _id(after) for room, after in rooms.items()}
            try:
                self.reads += 1
                resp = await self._read.call("XREAD", "COUNT", 1, "BLOCK", BLOCK_MS, "STREAMS", *streams,
                                                  self.wake_key, *rooms.values(), self._wake_last)
                backoff.reset()
            except REDIS_DOWN as exc:
                self._reading = {}
                self._wake_all()
                log.warning("stream watcher: redis unavailable (%s); retrying in %.1f s", exc, backoff.delay)
                await backoff.wait()
                continue
            self._reading = {}
            for name, entries in resp or []:
                stream = bytes(name).decode()
                newest = bytes(entries[-1][0]).decode()
                if stream == self.wake_key:
                    self._wake_last = newest
                    continue
                room = streams.get(stream)
                for waiter in self._waiters.get(room, []) if room is not None else []:
                    if _id(waiter.after) < _id(newest):
                        waiter.tail = newest
                        waiter.event.set()

    def _wake_all(self) -> None:
        for waiters in self._waiters.values():
            for waiter in waiters:
                waiter.event.set()

    async def aclose(self) -> None:
        if self._read is not None:
            await self._read.aclose()
