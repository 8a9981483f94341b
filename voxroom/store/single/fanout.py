"""The gateway's reads of its rooms on one Redis: one blocked ``XREAD`` per reader of at most
``rooms_per_reader`` rooms, each on a connection of its own.

Each reader holds one blocked ``XREAD`` over all its rooms' output streams plus a private *wake*
stream (``vx:gw:{id}:wake:{n}``), so that a room joining or leaving interrupts the read at once
instead of waiting for its block to end. Readers run under the gateway's supervisor as
``hub:reader:<n>``: one that fails is restarted (``/readyz`` reports it while down); an
unavailable Redis (down, loading, out of memory) is waited out with backoff, from the same cursors.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from redis.asyncio import Redis

from voxroom.runtime.supervisor import Supervisor
from voxroom.store import keys
from voxroom.store.autopipe import AutoPipeline
from voxroom.store.backoff import READ_DEADLINE_S, RECONNECT_CAP_S, REDIS_DOWN, Backoff
from voxroom.store.entry_ids import entry_id_str, tail
from voxroom.store.interface import Commands, FanoutEvents

log = logging.getLogger("voxroom.gateway.hub")

WAKE_MAXLEN = 16
WAKE_TTL_S = 3600
READ_BLOCK_MS = 2000
READ_COUNT = 512


class _Reader:
    def __init__(self, source: SingleFanout, index: int) -> None:
        self.source = source
        self.index = index
        self.name = f"hub:reader:{index}"
        self.wake_key = keys.gateway_wake(source.gateway_id, index)
        self.cursors: dict[str, str] = {}
        """Room -> id of the last entry read and delivered (or the tail when the room joined)."""
        self.wire = AutoPipeline(source.raw, timeout_s=READ_BLOCK_MS / 1000 + READ_DEADLINE_S)
        """This reader's own connection: a blocked read must not hold up anybody's commands."""
        self.task: asyncio.Task[None] | None = None
        """Its loop, as the supervisor runs it (restarted there when it fails)."""

    async def wake(self) -> None:
        # On the hub's shared pipeline: a hundred clients leaving at once are a hundred wakes,
        # which must not each take a connection.
        await self.source.control.group([("XADD", self.wake_key, "MAXLEN", WAKE_MAXLEN, "*", "w", 1),
                                         ("EXPIRE", self.wake_key, WAKE_TTL_S)])

    async def run(self) -> None:
        """Read and deliver until cancelled. Redis unavailable is waited out here; anything else
        raises to the supervisor, which restarts this (the cursors are kept)."""
        backoff = Backoff(cap=RECONNECT_CAP_S)
        events = self.source.events
        cut_off = False
        """Redis could not be read since the last successful read: its first read back is a backlog."""
        wake_cursor: str | None = None
        while True:
            try:
                if wake_cursor is None:
                    # An explicit id, not "$": a wake written between building the stream list and
                    # the XREAD reaching Redis must still be returned, or a joining room waits a
                    # whole block for its first read.
                    wake_cursor = await tail(self.source.control, self.wake_key)
                rooms = list(self.cursors.items())
                # Packed by hiredis on its own connection (voxroom/store/autopipe.py): a 200-room
                # XREAD costs a tenth of redis-py's packing, and this read runs once per burst of
                # entries, hundreds of times a second when many rooms speak.
                resp: Any = await self.wire.call(
                    "XREAD", "COUNT", READ_COUNT, "BLOCK", READ_BLOCK_MS, "STREAMS",
                    *[keys.room_output(r) for r, _ in rooms], self.wake_key, *[c for _, c in rooms], wake_cursor)
                backoff.reset()
            except REDIS_DOWN as exc:
                (log.warning if not cut_off else log.debug)(
                    "hub reader %d: redis unavailable (%s); retrying in %.1f s", self.index, exc, backoff.delay)
                cut_off = True
                events.unreachable(exc)
                await backoff.wait()
                continue
            events.reachable()
            for stream, entries in resp or []:
                name = stream.decode() if isinstance(stream, bytes) else stream
                if name == self.wake_key:
                    wake_cursor = entry_id_str(entries[-1][0])
                    continue
                room = keys.room_of_key(name)
                cursor = self.cursors.get(room)
                if cursor is not None:
                    if cut_off:
                        # Entries that waited in Redis while this gateway could not read: the
                        # hub replays them to each client at its own pace, before they go out live.
                        events.resync(room, cursor)
                    # Cursor moved and entries delivered with no await in between.
                    self.cursors[room] = entry_id_str(entries[-1][0])
                    events.deliver(room, entries)
            cut_off = False
            events.pulse()


class SingleFanout:
    """:class:`voxroom.store.interface.FanoutSource` on one Redis. ``raw``: a bytes client (its
    connection settings; each reader opens its own connection from them)."""

    def __init__(self, raw: Redis, control: Commands, supervisor: Supervisor, gateway_id: str,
                 events: FanoutEvents, *, rooms_per_reader: int = 200) -> None:
        self.raw = raw
        self.control = control
        self.supervisor = supervisor
        self.gateway_id = gateway_id
        self.events = events
        self.rooms_per_reader = rooms_per_reader
        self._readers: list[_Reader] = []
        self._reader_of: dict[str, _Reader] = {}

    def cursor(self, room: str) -> str | None:
        reader = self._reader_of.get(room)
        return reader.cursors.get(room) if reader is not None else None

    async def add(self, room: str, cursor: str) -> None:
        reader = self._pick()
        reader.cursors[room] = cursor
        self._reader_of[room] = reader
        try:
            await reader.wake()
        except REDIS_DOWN as exc:  # the reader takes the room at its next read anyway
            log.debug("could not wake hub reader %d: %s", reader.index, exc)

    async def remove(self, room: str) -> None:
        reader = self._reader_of.pop(room, None)
        if reader is None:
            return
        reader.cursors.pop(room, None)
        try:
            await reader.wake()
        except Exception as exc:  # the reader drops the room on its next read anyway
            log.debug("could not wake hub reader %d: %s", reader.index, exc)

    def _pick(self) -> _Reader:
        for reader in self._readers:
            if len(reader.cursors) < self.rooms_per_reader:
                return reader
        reader = _Reader(self, len(self._readers))
        reader.task = self.supervisor.spawn(reader.name, reader.run)
        self._readers.append(reader)
        return reader

    async def aclose(self) -> None:
        for reader in self._readers:
            await self.supervisor.stop(reader.name)
        for reader in self._readers:
            await reader.wire.aclose()
        if self._readers:
            with contextlib.suppress(*REDIS_DOWN):
                await self.control.call("DEL", *(r.wake_key for r in self._readers))
        self._readers.clear()
        self._reader_of.clear()
