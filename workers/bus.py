"""The worker's view of Redis: take jobs, keep them claimed, publish audio, keep room order.

All the Redis commands a worker sends live here, so that the pool and the publisher can be read
without knowing the key layout (see ``voxroom/keys.py``).
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

from redis.asyncio import BlockingConnectionPool, Redis
from redis.exceptions import ResponseError

from voxroom import keys
from voxroom.autopipe import AutoPipeline
from voxroom.redis_client import POOL_MAX_CONNECTIONS, POOL_WAIT_S
from workers.job import Job

log = logging.getLogger("voxroom.worker.bus")


class Turn(NamedTuple):
    next: int
    """The seq allowed to play next."""
    end_ms: float
    """Room-clock time where the room's audio ends."""
    started: int
    """The last seq whose start was published: ``started == next`` means that utterance began once
    already (its worker died) and must be restarted, not continued."""
    opus_wanted: bool


class WorkerBus:
    def __init__(self, redis: Redis, consumer: str, *, output_maxlen: int = 3000) -> None:
        self.redis = redis
        # Output entries carry binary audio: the blocked read that watches a room's output stream
        # must not decode it. Same server and options, raw bytes.
        # A blocking pool, as voxroom/redis_client.py's: utterances waiting for their turn each
        # hold a blocked read here, and the 101st must wait for a connection, not fail.
        raw_kwargs = {**redis.connection_pool.connection_kwargs, "decode_responses": False}
        self.raw = Redis(connection_pool=BlockingConnectionPool(
            connection_class=redis.connection_pool.connection_class, max_connections=POOL_MAX_CONNECTIONS,
            timeout=POOL_WAIT_S, **raw_kwargs))
        self.consumer = consumer
        self.output_maxlen = output_maxlen
        # The per-utterance commands (turn checks, slices, ends, acks) of every room this worker
        # publishes share pipelines (voxroom/autopipe.py); the blocking reads keep their own.
        self.auto = AutoPipeline(redis)
        self._reads = AutoPipeline(redis, timeout_s=30.0)
        """The job reader's own connection (its reads block; a read asks for at most 2 s)."""

    async def ensure_group(self) -> None:
        try:
            await self.redis.xgroup_create(keys.JOBS, keys.JOBS_GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def read_jobs(self, count: int, block_ms: int) -> list[Job]:
        """New jobs for this consumer, at most ``count``; waits up to ``block_ms`` for the first."""
        resp: Any = await self._reads.call("XREADGROUP", "GROUP", keys.JOBS_GROUP, self.consumer, "COUNT", count,
                                           "BLOCK", block_ms, "STREAMS", keys.JOBS, ">")
        entries = resp[0][1] if resp else []
        # Read raw (RESP2): each entry's fields come as [field, value, ...], or nil once trimmed.
        return await self._parse([(entry_id, dict(zip(flat[::2], flat[1::2], strict=True)) if flat is not None
                                   else None) for entry_id, flat in entries])

    async def claim_stale(self, min_idle_ms: int, count: int) -> list[Job]:
        """Jobs left pending by a consumer that went quiet (a dead worker), now ours."""
        resp: Any = await self.redis.xautoclaim(keys.JOBS, keys.JOBS_GROUP, self.consumer,
                                           min_idle_time=min_idle_ms, start_id="0-0", count=count)
        # Redis 6.2 answers [cursor, entries]; 7.x adds the ids of deleted entries.
        entries = resp[1] if len(resp) >= 2 else []
        return await self._parse(entries)

    async def touch(self, entry_ids: list[str]) -> None:
        """Reset the idle time of jobs we are still working on, so nobody claims them from us."""
        if entry_ids:
            ids: list[Any] = list(entry_ids)
            await self.redis.xclaim(keys.JOBS, keys.JOBS_GROUP, self.consumer, 0, ids, justid=True)

    async def ack(self, entry_id: str) -> None:
        await self.auto.call("XACK", keys.JOBS, keys.JOBS_GROUP, entry_id)

    async def _parse(self, entries: list[Any]) -> list[Job]:
        jobs = []
        for entry_id, fields in entries:
            if fields is None:  # trimmed away by MAXLEN while pending
                await self.ack(entry_id)
                continue
            try:
                jobs.append(Job.from_entry(entry_id, fields))
            except (KeyError, ValueError):
                log.warning("dropping malformed job %s: %r", entry_id, fields)
                await self.ack(entry_id)
        return jobs

    # -- room order ----------------------------------------------------------------------------

    async def room_turn(self, room: str) -> Turn:
        """Where the room's playback stands, and whether any client wants Opus (one round trip)."""
        (nxt, end_ms, started), opus = await self.auto.group([
            ("HMGET", keys.room_state(room), "next", "end_ms", "started"),
            ("EXISTS", keys.room_opus_demand(room))])
        return Turn(int(nxt or 1), float(end_ms or 0.0), int(started or 0), bool(opus))

    async def output_tail(self, room: str) -> str:
        last: Any = await self.raw.xrevrange(keys.room_output(room), count=1)  # entries may hold audio
        return bytes(last[0][0]).decode() if last else "0-0"

    async def wait_output(self, room: str, after_id: str, block_ms: int) -> str:
        """Block until the room's output stream has an entry after ``after_id``; return the new tail."""
        resp: Any = await self.raw.xread({keys.room_output(room): after_id}, block=max(1, block_ms), count=64)
        if resp:
            return bytes(resp[0][1][-1][0]).decode()
        return after_id

    async def close(self) -> None:
        await self.auto.aclose()
        await self._reads.aclose()
        await self.raw.aclose()

    async def skip_to(self, room: str, seq: int) -> None:
        """Let ``seq`` play even though an earlier utterance never finished (it waited too long)."""
        script = ("local n = tonumber(redis.call('HGET', KEYS[1], 'next') or '1') "
                  "if n < tonumber(ARGV[1]) then redis.call('HSET', KEYS[1], 'next', ARGV[1]) end")
        await self.redis.eval(script, 1, keys.room_state(room), seq)

    # -- output --------------------------------------------------------------------------------

    async def publish(self, room: str, entries: list[dict[Any, Any]], *, started: int | None = None) -> None:
        """Append output entries; ``started``: also record that this seq's start went out."""
        stream = keys.room_output(room)
        commands: list[list[Any]] = []
        for fields in entries:
            command: list[Any] = ["XADD", stream, "MAXLEN", "~", self.output_maxlen, "*"]
            for name, value in fields.items():
                command += (name, value)
            commands.append(command)
        if started is not None:
            commands.append(["HSET", keys.room_state(room), "started", started])
        await self.auto.group(commands)

    async def finish(self, room: str, seq: int, end_fields: dict[str, Any], end_ms: float) -> None:
        """Publish the ``end`` entry and pass the room's turn on, atomically. ``next`` and ``end_ms``
        only move forward: a late utterance that was skipped past must not rewind the room."""
        flat: list[Any] = []
        for name, value in end_fields.items():
            flat += [name, value]
        # EVAL, not EVALSHA: Redis caches the compiled script by its digest either way, and a
        # Redis that restarted empty needs no NOSCRIPT round trip.
        await self.auto.call("EVAL", _FINISH, 2, keys.room_output(room), keys.room_state(room),
                             seq + 1, f"{end_ms:.3f}", self.output_maxlen, *flat)

    async def heartbeat(self, worker_id: str, fields: dict[Any, Any], ttl_s: int) -> None:
        key = keys.worker_heartbeat(worker_id)
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(key, mapping=fields)
        pipe.expire(key, ttl_s)
        await pipe.execute()

    async def drop_heartbeat(self, worker_id: str) -> None:
        await self.redis.delete(keys.worker_heartbeat(worker_id))


_FINISH = """
redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[3], '*', unpack(ARGV, 4))
local n = tonumber(redis.call('HGET', KEYS[2], 'next') or '1')
if n < tonumber(ARGV[1]) then redis.call('HSET', KEYS[2], 'next', ARGV[1]) end
local e = tonumber(redis.call('HGET', KEYS[2], 'end_ms') or '0')
if e < tonumber(ARGV[2]) then redis.call('HSET', KEYS[2], 'end_ms', ARGV[2]) end
return 1
"""
