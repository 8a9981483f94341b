"""The worker's view of Redis: take jobs, keep them claimed, publish audio, keep room order.

All the Redis commands a worker sends live here, so that the pool and the publisher can be read
without knowing the key layout (see ``voxroom/keys.py``).

**Ownership is checked by Redis, not by the worker's clock.** A job belongs to the consumer that
the group's pending list names for it (``XPENDING vx:jobs workers <id> <id> 1``). A worker paused
(SIGSTOP, a long GC, a frozen VM) for longer than the claim time loses its jobs to another worker
(``XAUTOCLAIM``); when it wakes up it still believes it owns them. So every write a worker makes
for a job (its slices, its ``end`` and turn handover, a skip past a late predecessor, its ``XACK``,
the refresh of its idle time) is a script that first checks that the pending list still names this
consumer, and does nothing otherwise: the stale worker's writes are refused by Redis, atomically
with the check. The caller then drops the job silently (:class:`OwnershipLost`). The slices and
the ``end`` are also refused when the room's ``next`` is no longer the job's seq (a later line
skipped past it): :class:`TurnLost`, the line dropped as stale and acked.

**Room keys expire.** An utterance's first publish, then one a second, and its finish refresh
``EXPIRE room_idle_ttl_s`` on the room's output stream and state hash, and trim the output stream
by time (``XADD ... MINID ~`` the resume window) instead of by a count: a room nobody speaks in for
an hour leaves nothing behind. Private API rooms (``_api-*``) are never trimmed here: their gateway
may read them later than the window (a slow client), and trims what it has sent itself
(app/speech_room.py).
**On Redis Cluster** (``cluster`` given) the job methods go to :class:`workers.shards.ShardedJobs`:
job shards, and the ownership fence moved into the room's slot (an owner field in ``:state``),
the ack after it on the shard.
Private API rooms (``_api-*``) get a TTL only when they have none: their gateway deletes them, or
sets a short TTL when the caller left, and a worker must not lengthen it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, NamedTuple

from redis.asyncio import BlockingConnectionPool, Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError, ResponseError

from voxroom import keys
from voxroom.autopipe import AutoPipeline, redis_error
from voxroom.cluster_calls import ClusterCalls
from voxroom.redis_client import POOL_MAX_CONNECTIONS, POOL_WAIT_S
from voxroom.stream_watcher import StreamWatcher
from workers.job import Job
from workers.room_lua import PENDING_LUA, ROOM_LUA, TURN_LUA
from workers.shards import ShardedJobs

log = logging.getLogger("voxroom.worker.bus")

_MAINTAINED_MAX = 4096


class OwnershipLost(Exception):
    """Redis refused a write for a job: another worker claimed it while this one was not
    looking (paused, or cut off from Redis past the claim time). Drop the job: no more writes,
    no ack (the new owner acks it)."""


class TurnLost(OwnershipLost):
    """Redis refused a write for a job that is still ours because the room's turn is no longer
    its line's: ``next`` moved past its seq (a later line skipped past it, see
    ``workers/publisher.py``) after its turn check. Nothing of that write landed: it would have
    interleaved with the line that skipped. The publisher drops the line as stale and acks it;
    anything else that sees it treats it as :class:`OwnershipLost` (no more writes)."""


class Turn(NamedTuple):
    next: int
    """The seq allowed to play next."""
    end_ms: float
    """Room-clock time where the room's audio ends."""
    started: int
    """The last seq whose start was published: ``started == next`` means that utterance began once
    already (its worker died) and must be restarted, not continued."""
    opus_wanted: bool


# Shared by the scripts below (each is sent whole with EVAL: see ``finish``). ``owned`` treats a
# missing group (Redis came back empty) as "not ours": that job is gone anyway.
_PRELUDE = PENDING_LUA + "local owned = pending_to\n" + ROOM_LUA + TURN_LUA

_PUBLISH = _PRELUDE + """
-- KEYS: jobs, then per job its output stream and state hash. ARGV: group, consumer, window_ms,
-- ttl, then per job: entry id, seq, only_unset, started ('' for none), maintain ('1': trim and
-- refresh the TTLs), its number of entries, then per entry its number of field pairs and the pairs.
-- Returns per job 1 (written), 0 (not this consumer's: nothing written for it), -1 (ours, but the
-- room's next is not its seq any more: skipped past, nothing written) or the message of the error
-- one of its commands raised (the other jobs are not affected).
-- Cost per job: one XPENDING and one HGET (the turn), whatever its number of entries.
if redis.replicate_commands then redis.replicate_commands() end
local group, consumer, window, ttl = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local results = {}
local trim = nil
local a = 5
for j = 1, (#KEYS - 1) / 2 do
  local out, state = KEYS[2 * j], KEYS[2 * j + 1]
  local id, seq, only_unset, started = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
  local maintain = ARGV[a + 4] == '1'
  local first = a + 6
  local last = first
  for _ = 1, tonumber(ARGV[a + 5]) do last = last + 1 + tonumber(ARGV[last]) * 2 end
  a = last
  if not owned(KEYS[1], group, id, consumer) then
    results[j] = 0
  elseif not our_turn(state, seq) then
    results[j] = -1
  else
    local ok, err = pcall(function()
      local head = {'XADD', out, '*'}
      if maintain and only_unset ~= '1' then  -- a private room ('1') is trimmed by its gateway, never here
        trim = trim or minid(window)
        head = {'XADD', out, 'MINID', '~', trim, '*'}
      end
      local i = first
      while i < last do
        local n = tonumber(ARGV[i]) * 2
        local cmd = {unpack(head)}
        for k = i + 1, i + n do cmd[#cmd + 1] = ARGV[k] end
        redis.call(unpack(cmd))
        i = i + n + 1
      end
      if started ~= '' then redis.call('HSET', state, 'started', started) end
      if maintain then
        refresh(out, ttl, only_unset)
        refresh(state, ttl, only_unset)
      end
    end)
    if ok then
      results[j] = 1
    elseif type(err) == 'table' then
      results[j] = tostring(err.err or err)
    else
      results[j] = tostring(err)
    end
  end
end
return results
"""

PUBLISH_BATCH_JOBS = 64
"""Most jobs' publishes in one script. A script runs alone in Redis: 64 rooms' slices hold it
for about a millisecond and a half; a tick of more rooms is several scripts in one write."""
PUBLISH_BATCH_ENTRIES = 256
"""Most entries in one script (an unpaced job may bring 64 slices, each with its Opus copy)."""

MAINTAIN_EVERY_S = 1.0
"""How often one utterance's publishes trim the room's output stream and refresh its keys' TTLs.
Both only need doing about once a second (the window is minutes, the TTL an hour, ``MINID ~``
trims whole stream nodes anyway); doing them on every 40 ms publish was about 2 ms of Redis CPU
per line at 100 rooms (docs/benchmarks.md)."""

_FINISH = _PRELUDE + """
-- KEYS: jobs, output, state. ARGV: group, entry id, consumer, window_ms, ttl, only_unset, next,
-- end_ms, then the end entry's field pairs. The end, the turn handover and the ack are one step.
-- Returns 1, 0 (not ours) or -1 (ours, but the room's next is not this line's seq: nothing
-- written, not acked). So ``next`` only ever moves from this seq to the one after it: never back,
-- never past a line that skipped past this one and may be playing. The turn check is the HGET of
-- ``next`` this script always made.
if not owned(KEYS[1], ARGV[1], ARGV[2], ARGV[3]) then return 0 end
if not our_turn(KEYS[3], tonumber(ARGV[7]) - 1) then return -1 end
-- A private room (only_unset '1') keeps everything: its gateway trims what it has sent.
redis.call('XADD', KEYS[2], 'MINID', '~', ARGV[6] == '1' and '0' or minid(ARGV[4]), '*', unpack(ARGV, 9))
redis.call('HSET', KEYS[3], 'next', ARGV[7])
local e = tonumber(redis.call('HGET', KEYS[3], 'end_ms') or '0')
if e < tonumber(ARGV[8]) then redis.call('HSET', KEYS[3], 'end_ms', ARGV[8]) end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
refresh(KEYS[2], ARGV[5], ARGV[6])
refresh(KEYS[3], ARGV[5], ARGV[6])
return 1
"""

_SKIP = _PRELUDE + """
-- KEYS: jobs, state. ARGV: group, entry id, consumer, seq.
if not owned(KEYS[1], ARGV[1], ARGV[2], ARGV[3]) then return 0 end
local n = tonumber(redis.call('HGET', KEYS[2], 'next') or '1')
if n < tonumber(ARGV[4]) then redis.call('HSET', KEYS[2], 'next', ARGV[4]) end
return 1
"""

_ACK = _PRELUDE + """
-- KEYS: jobs. ARGV: group, entry id, consumer.
if not owned(KEYS[1], ARGV[1], ARGV[2], ARGV[3]) then return 0 end
return redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
"""

_TOUCH = _PRELUDE + """
-- KEYS: jobs. ARGV: group, consumer, entry ids. Resets the idle time of the entries this
-- consumer still owns; returns the ids it no longer owns.
local lost = {}
for i = 3, #ARGV do
  if owned(KEYS[1], ARGV[1], ARGV[i], ARGV[2]) then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
  else
    lost[#lost + 1] = ARGV[i]
  end
end
return lost
"""


class _Publish(NamedTuple):
    """One job's entries waiting for the loop turn's publish script."""
    job: Job
    entries: list[dict[Any, Any]]
    started: int | None
    maintain: bool
    done: asyncio.Future[int]
    """The script's reply for the job: 1 written, 0 no longer ours, -1 its turn is gone."""


class WorkerBus:
    def __init__(self, redis: Redis, consumer: str, *, resume_window_ms: int = 120_000,
                 room_idle_ttl_s: int = 3600, cluster: ClusterCalls | None = None,
                 raw_cluster: ClusterCalls | None = None, job_shards: int = 12) -> None:
        """``cluster`` / ``raw_cluster`` (text / bytes replies): Redis Cluster clients, owned by
        the bus from then on (closed by :meth:`close`); ``job_shards``: the deployment's."""
        self.redis = redis
        self.cluster = cluster
        self.raw_cluster = raw_cluster
        self.jobs = (ShardedJobs(cluster, consumer, shards=job_shards, room_idle_ttl_s=room_idle_ttl_s)
                     if cluster is not None else None)
        # Output entries carry binary audio: the blocked read that watches a room's output stream
        # must not decode it. Same server and options, raw bytes.
        # A blocking pool, as voxroom/redis_client.py's: utterances waiting for their turn each
        # hold a blocked read here, and the 101st must wait for a connection, not fail.
        raw_kwargs = {**redis.connection_pool.connection_kwargs, "decode_responses": False}
        self.raw = Redis(connection_pool=BlockingConnectionPool(
            connection_class=redis.connection_pool.connection_class, max_connections=POOL_MAX_CONNECTIONS,
            timeout=POOL_WAIT_S, **raw_kwargs))
        self.consumer = consumer
        self.resume_window_ms = resume_window_ms
        self.room_idle_ttl_s = room_idle_ttl_s
        # The per-utterance commands (turn checks, slices, ends, acks) of every room this worker
        # publishes share pipelines (voxroom/autopipe.py); the blocking reads keep their own.
        self.auto = AutoPipeline(redis)
        self._reads = AutoPipeline(redis, timeout_s=30.0)
        """The job reader's own connection (its reads block; a read asks for at most 2 s)."""
        self.watcher: StreamWatcher | None = None
        """Set by the worker: every turn wait shares its one blocked read."""
        self._publishes: list[_Publish] = []
        """Publishes issued in this loop turn, sent together by :meth:`_send_publishes`."""
        self._publish_scheduled = False
        self._maintained: dict[str, float] = {}
        """Job entry id -> when its publishes last trimmed and refreshed the room's keys. An
        entry leaves on the job's finish or lost ownership; the bound below covers any other end."""

    async def ensure_group(self) -> None:
        if self.jobs is not None:
            await self.jobs.ensure_groups()
            return
        try:
            await self.redis.xgroup_create(keys.JOBS, keys.JOBS_GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def read_jobs(self, count: int, block_ms: int) -> list[Job]:
        """New jobs for this consumer, at most ``count``; waits up to ``block_ms`` for the first."""
        if self.jobs is not None:
            return await self.jobs.read_jobs(count, block_ms)
        resp: Any = await self._reads.call("XREADGROUP", "GROUP", keys.JOBS_GROUP, self.consumer, "COUNT", count,
                                           "BLOCK", block_ms, "STREAMS", keys.JOBS, ">")
        entries = resp[0][1] if resp else []
        # Read raw (RESP2): each entry's fields come as [field, value, ...], or nil once trimmed.
        return await self._parse([(entry_id, dict(zip(flat[::2], flat[1::2], strict=True)) if flat is not None
                                   else None) for entry_id, flat in entries])

    async def claim_stale(self, min_idle_ms: int, count: int) -> list[Job]:
        """Jobs left pending by a consumer that went quiet (a dead worker), now ours."""
        if self.jobs is not None:
            return await self.jobs.claim_stale(min_idle_ms, count)
        resp: Any = await self.auto.call("XAUTOCLAIM", keys.JOBS, keys.JOBS_GROUP, self.consumer, min_idle_ms,
                                         "0-0", "COUNT", count)
        # Redis 6.2 answers [cursor, entries]; 7.x adds the ids of deleted entries.
        entries = resp[1] if len(resp) >= 2 else []
        return await self._parse([(entry_id, dict(zip(flat[::2], flat[1::2], strict=True)) if flat is not None
                                   else None) for entry_id, flat in entries])

    async def touch(self, entry_ids: list[str]) -> list[str]:
        """Reset the idle time of jobs we are still working on, so nobody claims them from us.
        Returns the ids that are no longer ours (another worker claimed them, or they are gone):
        the caller drops those jobs."""
        if self.jobs is not None:
            return await self.jobs.touch(entry_ids)
        if not entry_ids:
            return []
        lost: Any = await self.auto.call("EVAL", _TOUCH, 1, keys.JOBS, keys.JOBS_GROUP, self.consumer, *entry_ids)
        return [str(entry_id) for entry_id in lost]

    async def ack(self, job: Job) -> bool:
        """Ack ``job`` if it is still ours (``False``: another worker owns it; nothing done)."""
        if self.jobs is not None:
            return await self.jobs.ack(job)
        return bool(await self.auto.call("EVAL", _ACK, 1, keys.JOBS, keys.JOBS_GROUP, job.entry_id,
                                         self.consumer))

    async def _drop_entry(self, entry_id: str) -> None:
        """Ack an entry that was delivered to us but cannot become a job (trimmed or malformed)."""
        await self.auto.call("XACK", keys.JOBS, keys.JOBS_GROUP, entry_id)

    async def _parse(self, entries: list[Any]) -> list[Job]:
        jobs = []
        for entry_id, fields in entries:
            if fields is None:  # trimmed away by MAXLEN while pending
                await self._drop_entry(entry_id)
                continue
            try:
                jobs.append(Job.from_entry(entry_id, fields))
            except (KeyError, ValueError):
                log.warning("dropping malformed job %s: %r", entry_id, fields)
                await self._drop_entry(entry_id)
        return jobs

    # -- room order ----------------------------------------------------------------------------

    async def room_turn(self, room: str) -> Turn:
        """Where the room's playback stands, and whether any client wants Opus (one round trip)."""
        if self.cluster is not None:
            (nxt, end_ms, started), opus = await asyncio.gather(
                self.cluster.call("HMGET", keys.room_state(room), "next", "end_ms", "started"),
                self.cluster.call("EXISTS", keys.room_opus_demand(room)))
            return Turn(int(nxt or 1), float(end_ms or 0.0), int(started or 0), bool(opus))
        (nxt, end_ms, started), opus = await self.auto.group([
            ("HMGET", keys.room_state(room), "next", "end_ms", "started"),
            ("EXISTS", keys.room_opus_demand(room))])
        return Turn(int(nxt or 1), float(end_ms or 0.0), int(started or 0), bool(opus))

    async def output_tail(self, room: str) -> str:
        if self.raw_cluster is not None:
            tail: Any = await self.raw_cluster.call("XREVRANGE", keys.room_output(room), "+", "-", "COUNT", 1)
            return bytes(tail[0][0]).decode() if tail else "0-0"
        last: Any = await self.raw.xrevrange(keys.room_output(room), count=1)  # entries may hold audio
        return bytes(last[0][0]).decode() if last else "0-0"

    async def wait_output(self, room: str, after_id: str, block_ms: int) -> str:
        """Block until the room's output stream has an entry after ``after_id``; return the new tail.
        Through the worker's one turn watcher when it has one (``voxroom/stream_watcher.py``)."""
        if self.watcher is not None:
            return await self.watcher.wait(room, after_id, max(1, block_ms) / 1000.0)
        if self.raw_cluster is not None:
            stream = keys.room_output(room)
            got: Any = await self.raw_cluster.call_at(stream, "XREAD", "COUNT", 64, "BLOCK", max(1, block_ms),
                                                      "STREAMS", stream, after_id)
            return _last_read_id(got, after_id)
        resp: Any = await self.raw.xread({keys.room_output(room): after_id}, block=max(1, block_ms), count=64)
        if resp:
            return bytes(resp[0][1][-1][0]).decode()
        return after_id

    async def close(self) -> None:
        if self.jobs is not None:
            await self.jobs.aclose()
        for cluster in (self.cluster, self.raw_cluster):
            if cluster is not None:
                await cluster.aclose()
        await self.auto.aclose()
        await self._reads.aclose()
        await self.raw.aclose()
        # A Redis given its pool leaves it open on aclose(): this pool is ours alone.
        await self.raw.connection_pool.disconnect()

    async def skip_to(self, job: Job) -> None:
        """Let ``job`` play even though an earlier utterance never finished (it waited too long).
        Raises :class:`OwnershipLost` when ``job`` is no longer ours."""
        if self.jobs is not None:
            if not await self.jobs.skip_to(job):
                raise OwnershipLost(job.entry_id)
            return
        done = await self.auto.call("EVAL", _SKIP, 2, keys.JOBS, keys.room_state(job.room), keys.JOBS_GROUP,
                                    job.entry_id, self.consumer, job.seq)
        if not done:
            raise OwnershipLost(job.entry_id)

    # -- output --------------------------------------------------------------------------------

    def _room_args(self, job: Job) -> list[Any]:
        """window_ms, ttl, only_unset: the part of a write script's ARGV about the room's keys."""
        private = job.room.startswith(keys.PRIVATE_ROOM_PREFIX)
        return [self.resume_window_ms, self.room_idle_ttl_s, "1" if private else "0"]

    async def publish(self, job: Job, entries: list[dict[Any, Any]], *, started: int | None = None) -> None:
        """Append output entries for ``job``; ``started``: also record that this seq's start went
        out. Nothing is written unless ``job`` is still ours (:class:`OwnershipLost`) and the
        room's ``next`` is still its seq (:class:`TurnLost`: a later line skipped past it).

        The publishes of every room issued in one loop turn (a paced tick's slices) leave as one
        script: Redis runs one script instead of one per room, and a gateway's blocked read of
        those rooms wakes once for all of them instead of at the first room's entry and again
        for the rest (docs/benchmarks.md). Each job is still fenced on its own: one job that is
        no longer ours, or whose write fails, fails only its own publish."""
        if self.jobs is not None:
            _raise_refused(await self.jobs.publish(job, self.resume_window_ms, started, self._due(job), entries),
                           job, self._maintained)
            return
        await self.auto.capacity()
        loop = asyncio.get_running_loop()
        item = _Publish(job, entries, started, self._due(job), loop.create_future())
        self._publishes.append(item)
        if not self._publish_scheduled:
            # Called back after every task woken in this loop turn (a tick's publishers) queued its own.
            self._publish_scheduled = True
            loop.call_soon(self._send_publishes)
        _raise_refused(await item.done, job, self._maintained)

    def _send_publishes(self) -> None:
        self._publish_scheduled = False
        queued, self._publishes = self._publishes, []
        batch: list[_Publish] = []
        entries = 0
        for item in queued:
            if batch and (len(batch) >= PUBLISH_BATCH_JOBS or entries + len(item.entries) > PUBLISH_BATCH_ENTRIES):
                self._send_publish_batch(batch)
                batch, entries = [], 0
            batch.append(item)
            entries += len(item.entries)
        if batch:
            self._send_publish_batch(batch)
        # This callback runs after every publisher of the loop turn queued its publish: the
        # script leaves now, not one more loop turn later (a first slice's way to the room).
        self.auto.flush()

    def _send_publish_batch(self, batch: list[_Publish]) -> None:
        script_keys: list[Any] = [keys.JOBS]
        argv: list[Any] = [keys.JOBS_GROUP, self.consumer, self.resume_window_ms, self.room_idle_ttl_s]
        for item in batch:
            job = item.job
            script_keys += (keys.room_output(job.room), keys.room_state(job.room))
            private = job.room.startswith(keys.PRIVATE_ROOM_PREFIX)
            argv += (job.entry_id, job.seq, "1" if private else "0", "" if item.started is None else item.started,
                     "1" if item.maintain else "0", len(item.entries))
            for fields in item.entries:
                argv.append(len(fields))
                for name, value in fields.items():
                    argv += (name, value)
        # EVAL, not EVALSHA: Redis caches the compiled script by its digest either way, and a
        # Redis that restarted empty needs no NOSCRIPT round trip.
        sent = self.auto.submit([("EVAL", _PUBLISH, len(script_keys), *script_keys, *argv)])
        sent.add_done_callback(lambda done: self._published(batch, done))

    def _published(self, batch: list[_Publish], done: asyncio.Future[list[Any]]) -> None:
        error: BaseException | None = (RedisConnectionError("publish cancelled") if done.cancelled()
                                       else done.exception())
        if isinstance(error, DataError) and len(batch) > 1:
            # An argument Redis cannot take (it never reached Redis): send each job alone, so
            # that only the one that holds it fails, as with a script per job.
            for item in batch:
                self._send_publish_batch([item])
            return
        reply: Any = None
        if error is None:
            reply = done.result()[0]
            if isinstance(reply, ResponseError):
                error = redis_error(reply)
        for i, item in enumerate(batch):
            if item.done.done():  # its publisher was cancelled meanwhile
                continue
            if error is not None:
                item.done.set_exception(error)
            elif isinstance(reply[i], int):
                item.done.set_result(reply[i])
            else:
                text = reply[i].decode(errors="replace") if isinstance(reply[i], bytes) else str(reply[i])
                item.done.set_exception(redis_error(ResponseError(text)))

    def _due(self, job: Job) -> bool:
        """Whether this publish of ``job`` should trim and refresh (its first, then once a second)."""
        now = time.monotonic()
        last = self._maintained.get(job.entry_id)
        if last is not None and now - last < MAINTAIN_EVERY_S:
            return False
        if last is None and len(self._maintained) >= _MAINTAINED_MAX:
            self._maintained.clear()  # jobs that ended some other way: forgetting costs one refresh each
        self._maintained[job.entry_id] = now
        return True

    async def finish(self, job: Job, end_fields: dict[str, Any], end_ms: float) -> None:
        """Publish the ``end`` entry, pass the room's turn on and ack the job, atomically and
        only while ``job`` is ours (:class:`OwnershipLost` otherwise) and the room's ``next`` is
        still its seq (:class:`TurnLost` otherwise: a line skipped past it, nothing written, the
        caller acks it). ``next`` moves from its seq to the one after, never back and never past
        the line that skipped; ``end_ms`` only moves forward."""
        self._maintained.pop(job.entry_id, None)  # the end always trims and refreshes
        if self.jobs is not None:
            _raise_refused(await self.jobs.finish(job, self.resume_window_ms, end_ms, end_fields), job, None)
            return
        flat: list[Any] = []
        for name, value in end_fields.items():
            flat += [name, value]
        done: Any = await self.auto.call("EVAL", _FINISH, 3, keys.JOBS, keys.room_output(job.room),
                                         keys.room_state(job.room), keys.JOBS_GROUP, job.entry_id, self.consumer,
                                         *self._room_args(job), job.seq + 1, f"{end_ms:.3f}", *flat)
        _raise_refused(int(done), job, None)

    # -- worker registry -----------------------------------------------------------------------

    async def heartbeat(self, worker_id: str, fields: dict[Any, Any], ttl_s: int, now_ms: int) -> None:
        """The heartbeat hash (with its TTL) and this worker's entry in the ``vx:workers``
        registry; entries older than ``ttl_s`` (workers that died without a word) are pruned.
        Ordered, not atomic: during an OOM the hash's TTL is still refreshed (EXPIRE is allowed
        then), so a worker alive through an outage does not vanish from the directory."""
        key = keys.worker_heartbeat(worker_id)
        flat: list[Any] = []
        for name, value in fields.items():
            flat += [name, value]
        if self.cluster is not None:  # two slots: the hash's and the registry's
            await self.cluster.call("HSET", key, *flat)
            await self.cluster.call("EXPIRE", key, ttl_s)
            await self.cluster.call("ZADD", keys.WORKERS, now_ms, worker_id)
            await self.cluster.call("ZREMRANGEBYSCORE", keys.WORKERS, "-inf", f"({now_ms - ttl_s * 1000}")
            return
        await self.auto.group([("HSET", key, *flat), ("EXPIRE", key, ttl_s),
                               ("ZADD", keys.WORKERS, now_ms, worker_id),
                               ("ZREMRANGEBYSCORE", keys.WORKERS, "-inf", f"({now_ms - ttl_s * 1000}")])

    async def drop_heartbeat(self, worker_id: str) -> None:
        if self.cluster is not None:
            await self.cluster.call("DEL", keys.worker_heartbeat(worker_id))
            await self.cluster.call("ZREM", keys.WORKERS, worker_id)
            return
        await self.auto.group([("DEL", keys.worker_heartbeat(worker_id)), ("ZREM", keys.WORKERS, worker_id)])


def _raise_refused(reply: int, job: Job, maintained: dict[str, float] | None) -> None:
    """A write script's reply for ``job``: 1 written; 0 :class:`OwnershipLost`; -1
    :class:`TurnLost`. A refused job's maintenance record goes (no more writes follow)."""
    if reply == 1:
        return
    if maintained is not None:
        maintained.pop(job.entry_id, None)
    if reply == -1:
        raise TurnLost(f"{job.entry_id}: room {job.room} moved past seq {job.seq}")
    raise OwnershipLost(job.entry_id)


def _last_read_id(resp: Any, after_id: str) -> str:
    """The id of the last entry an ``XREAD`` of one stream gave (``after_id`` when none)."""
    if not resp:
        return after_id
    entries = next(iter(resp.values())) if isinstance(resp, dict) else resp[0][1]
    if not entries:
        return after_id
    last = entries[-1][0]
    return last.decode() if isinstance(last, bytes) else str(last)
