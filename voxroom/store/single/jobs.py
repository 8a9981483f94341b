"""The worker's job queue on one Redis: ``vx:jobs`` read through the consumer group ``workers``.

A job belongs to the consumer that the group's pending list names for it (``XPENDING vx:jobs
workers <id> <id> 1``): that is the fence every write for the job checks (voxroom/store/lua/room.py
``SINGLE``), and the end, the turn handover and the ``XACK`` are one script.
"""

from __future__ import annotations

import logging
from typing import Any

from redis.exceptions import ResponseError

from voxroom.store import keys
from voxroom.store.autopipe import AutoPipeline
from voxroom.store.entry_ids import entry_id_str
from voxroom.store.interface import Fence
from voxroom.store.lua import jobs
from voxroom.store.lua.room import SINGLE, RoomScripts
from voxroom.wire.jobs import Job

log = logging.getLogger("voxroom.worker.bus")

SCRIPTS = RoomScripts(SINGLE)


class SingleJobQueue:
    """:class:`voxroom.store.interface.JobQueue` on one Redis. ``auto``: the job bus's pipeline
    (text replies; the bus closes it); ``reads``: a pipeline of its own for the blocked
    ``XREADGROUP`` (a read asks for at most 2 s; its reply timeout is longer), closed by
    :meth:`aclose`."""

    scripts = SCRIPTS

    def __init__(self, auto: AutoPipeline, reads: AutoPipeline, consumer: str) -> None:
        self.auto = auto
        self.reads = reads
        self.consumer = consumer

    async def ensure_groups(self) -> None:
        try:
            await self.auto.call("XGROUP", "CREATE", keys.JOBS, keys.JOBS_GROUP, "0", "MKSTREAM")
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def read(self, count: int, block_ms: int) -> list[Job]:
        resp: Any = await self.reads.call("XREADGROUP", "GROUP", keys.JOBS_GROUP, self.consumer, "COUNT", count,
                                          "BLOCK", block_ms, "STREAMS", keys.JOBS, ">")
        return await self._parse(resp[0][1] if resp else [])

    async def claim_stale(self, min_idle_ms: int, count: int) -> list[Job]:
        resp: Any = await self.auto.call("XAUTOCLAIM", keys.JOBS, keys.JOBS_GROUP, self.consumer, min_idle_ms,
                                         "0-0", "COUNT", count)
        # Redis 6.2 answers [cursor, entries]; 7.x adds the ids of deleted entries.
        return await self._parse(resp[1] if len(resp) >= 2 else [])

    async def touch(self, entry_ids: list[str]) -> list[str]:
        lost: Any = await self.auto.call("EVAL", jobs.TOUCH, 1, keys.JOBS, keys.JOBS_GROUP, self.consumer, *entry_ids)
        return [entry_id_str(entry_id) for entry_id in lost]

    def fence(self, job: Job) -> Fence:
        return Fence(keys.JOBS, job.entry_id, self.consumer)

    async def done(self, job: Job) -> bool:
        return True  # the room script acked it

    def forget(self, entry_id: str) -> None:
        return None  # nothing kept per job here

    async def drop(self, entry_id: str) -> None:
        await self.auto.call("XACK", keys.JOBS, keys.JOBS_GROUP, entry_id)

    async def _parse(self, entries: list[Any]) -> list[Job]:
        """Raw (RESP2) entries: each one's fields come as [field, value, ...], or nil once trimmed."""
        found = []
        for raw_id, flat in entries:
            entry_id = entry_id_str(raw_id)
            if flat is None:  # trimmed away by MAXLEN while pending
                await self.drop(entry_id)
                continue
            fields = dict(zip(flat[::2], flat[1::2], strict=True))
            try:
                found.append(Job.from_entry(entry_id, fields))
            except (KeyError, ValueError):
                log.warning("dropping malformed job %s: %r", entry_id, fields)
                await self.drop(entry_id)
        return found

    async def aclose(self) -> None:
        await self.reads.aclose()
