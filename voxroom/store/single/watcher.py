"""One blocked ``XREAD`` for every "wait until this room's output stream moves" in a process, on
one Redis.

A worker's utterances wait for their room's turn through it; a gateway's ``POST
/v1/audio/speech`` responses wait for their private room's next slices through it. (The gateway's
room fan-out reads with readers of its own, ``voxroom/store/single/fanout.py``: it delivers every
entry; this only says *that* a stream moved, and the waiter reads what it wants.)

One loop (supervised: ``turns`` on a worker, ``gateway:streams`` on a gateway) holds one blocked
``XREAD`` over the output streams of the rooms that have a waiter, plus a private wake stream: a
waiter for a room the read does not cover yet ``XADD``s to it, so the read starts again with the
new room at once. Before, each waiting utterance held a pooled connection in a blocking ``XREAD``
of its own: up to 256 from a pool, on a host that can hold 8 x 64 utterances.

Redis unavailable: the loop backs off, and wakes every waiter, which checks for itself (a waiter
never sleeps past its own timeout either way).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from redis.asyncio import Redis

from voxroom.store import keys
from voxroom.store.autopipe import AutoPipeline
from voxroom.store.backoff import READ_DEADLINE_S, RECONNECT_CAP_S, REDIS_DOWN, Backoff
from voxroom.store.entry_ids import id_tuple
from voxroom.store.interface import Commands

log = logging.getLogger("voxroom.watcher")

BLOCK_MS = 2000
"""Longest blocked read; a new waiter's room interrupts it through the wake stream."""
WAKE_TTL_S = 3600


class _Waiter:
    __slots__ = ("after", "event", "tail")

    def __init__(self, after: str) -> None:
        self.after = after
        self.event = asyncio.Event()
        self.tail = after


class SingleWatcher:
    """:class:`voxroom.store.interface.StreamWatch` on one Redis. ``raw``: a bytes client (output
    entries carry audio; the watcher's read opens its own connection from its settings);
    ``control``: the pipeline that sends the wake ``XADD`` (never the blocked connection itself)."""

    def __init__(self, raw: Redis, control: Commands, wake_key: str) -> None:
        self._read = AutoPipeline(raw, timeout_s=BLOCK_MS / 1000 + READ_DEADLINE_S)
        self._control = control
        self.wake_key = wake_key
        self._waiters: dict[str, list[_Waiter]] = {}
        self._reading: dict[str, tuple[int, int]] = {}
        """What the read in flight covers: room -> the id it reads after."""
        self._wake_last = "0-0"
        self.reads = 0

    async def wait(self, room: str, after_id: str, timeout_s: float) -> str:
        waiter = _Waiter(after_id)
        self._waiters.setdefault(room, []).append(waiter)
        try:
            covered = self._reading.get(room)
            if covered is None or covered > id_tuple(after_id):
                await self._wake()
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for returns the result when a
            # cancel lands as the event fires (CPython gh-86296), and a publisher stopped by a
            # worker's drain then went on waiting for its turn (30 s, a CI failure).
            try:
                async with asyncio.timeout(timeout_s):
                    await waiter.event.wait()
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

    async def _wake(self) -> None:
        try:
            await self._control.group([("XADD", self.wake_key, "MAXLEN", "~", 16, "*", "w", 1),
                                       ("EXPIRE", self.wake_key, WAKE_TTL_S)])
        except REDIS_DOWN as exc:
            # The read is down too, or about to be: it wakes everyone when it fails.
            log.debug("stream watcher: wake failed: %s", exc)

    async def run(self) -> None:
        backoff = Backoff(cap=RECONNECT_CAP_S)
        while True:
            rooms = {room: min((w.after for w in waiters), key=id_tuple) for room, waiters in self._waiters.items()}
            streams = {keys.room_output(room): room for room in rooms}
            self._reading = {room: id_tuple(after) for room, after in rooms.items()}
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
                    if id_tuple(waiter.after) < id_tuple(newest):
                        waiter.tail = newest
                        waiter.event.set()

    def _wake_all(self) -> None:
        for waiters in self._waiters.values():
            for waiter in waiters:
                waiter.event.set()

    async def aclose(self) -> None:
        await self._read.aclose()
        with contextlib.suppress(*REDIS_DOWN):
            await self._control.call("DEL", self.wake_key)
