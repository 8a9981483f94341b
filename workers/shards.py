"""The worker's jobs on Redis Cluster: job shards read fairly, and every write in one slot.

On one Redis instance a job's writes to its room and its ``XACK`` on ``vx:jobs`` are one script,
fenced by the job stream's pending list (workers/bus.py). On a cluster the room's keys and the
job's shard (``vx:jobs:{jK}``, docs/cluster.md) lie in different slots, so:

- **Reading.** Each shard has its own consumer group ``workers``. A read asks the shards in turn
  (the first one rotates) for as many jobs as the pool has room for, without blocking; only when
  none has any does it block, with one ``XREADGROUP ... COUNT 1`` per shard, and keeps the reads
  still blocked for the next call rather than cancelling them (a cancelled read may have been
  served: its job would sit unseen in our pending list until claimed). Jobs that arrive beyond
  the room asked for are held here and returned first next time (at most one per shard), and
  :meth:`ShardedJobs.held_ids` lets the keeper keep them claimed.
- **Ownership, in the room's slot.** When a worker gets a job (read, or adopted with
  ``XAUTOCLAIM``) it *takes* the line: ``owner:<seq>`` in the room's ``:state`` becomes
  ``deliveries|consumer|entry``, where ``deliveries`` is the shard's delivery count of the entry
  (1 when read; ``XAUTOCLAIM`` adds one). A take fails when the field already names a later
  delivery of the same entry (a stale worker waking after its job was adopted) or another entry
  (the same line handed twice: ours is a duplicate and is acked at once). Every room write of the
  job (its slices, the skip past a late predecessor, the end and turn handover) is a script that
  first checks that the field still holds our token: a worker that lost its job writes nothing
  more to the room, atomically with the check, as on a single instance. The slices and the end
  also check that the room's ``next`` is still the line's seq (the same slot): a line a later line
  skipped past is refused there too (``-1``: :class:`workers.bus.TurnLost`).
- **Acking, in the shard's slot, after.** The end deletes the owner field in the same script as
  the turn handover; the ``XACK`` (fenced by the shard's pending list) follows. A crash between
  the two leaves the job pending: the worker that adopts it takes the line (no owner any more),
  finds ``next > seq`` and acks it without publishing. Nothing is spoken twice.

Job entry ids are ``<shard>/<stream id>`` here (two shards may give the same stream id in the
same millisecond), so the worker's bookkeeping by entry id needs no change.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any

from redis.exceptions import ResponseError

from voxroom import keys
from voxroom.cluster_calls import ClusterCalls
from workers.job import Job
from workers.room_lua import PENDING_LUA, ROOM_LUA, TURN_LUA

log = logging.getLogger("voxroom.worker.shards")

_PRELUDE = """
local function owned(state, field, token)
  return redis.call('HGET', state, field) == token
end
local function ring(output)
  return redis.call('SPUBLISH', string.sub(output, 1, -4) .. 'bell', '')
end
""" + ROOM_LUA + TURN_LUA
"""``ring(output)``: the room's doorbell (``keys.room_bell``: ``vx:room:{R}:out`` -> ``vx:room:{R}:bell``,
the same hash tag, so the same slot), rung once per script call that appended to ``:out``: the
gateways subscribed to it read the room now (voxroom/cluster_bells.py). Needs Redis 7.0."""

# KEYS: 1 state. ARGV: 1 owner field, 2 token, 3 deliveries, 4 entry, 5 ttl, 6 only_unset.
# Returns 1 taken, 0 a later delivery of this entry owns the line, -1 another entry does.
_TAKE = _PRELUDE + """
local v = redis.call('HGET', KEYS[1], ARGV[1])
if v and v ~= ARGV[2] then
  local d, entry = string.match(v, '^(%d+)|.*|([^|]*)$')
  if entry ~= ARGV[4] then return -1 end
  if tonumber(d) >= tonumber(ARGV[3]) then return 0 end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
refresh(KEYS[1], ARGV[5], ARGV[6])
return 1
"""

# KEYS: 1 output, 2 state. ARGV: 1 owner field, 2 token, 3 window_ms, 4 ttl, 5 only_unset,
# 6 started ('' for none), 7 maintain, 8 seq, then per entry: its number of field pairs, the pairs.
# Returns 1 written, 0 not ours, -1 ours but the room's next is not its seq (a later line skipped
# past it): nothing written. Cost: the owner HGET, the turn HGET and one SPUBLISH, whatever the entries.
_PUBLISH = _PRELUDE + """
if not owned(KEYS[2], ARGV[1], ARGV[2]) then return 0 end
if not our_turn(KEYS[2], ARGV[8]) then return -1 end
local maintain = ARGV[7] == '1'
local head = {'XADD', KEYS[1], '*'}
-- A private room (only_unset '1') is trimmed by its gateway, never here (workers/bus.py).
if maintain and ARGV[5] ~= '1' then head = {'XADD', KEYS[1], 'MINID', '~', minid(ARGV[3]), '*'} end
local i = 9
while i <= #ARGV do
  local n = tonumber(ARGV[i]) * 2
  local cmd = {unpack(head)}
  for j = i + 1, i + n do cmd[#cmd + 1] = ARGV[j] end
  redis.call(unpack(cmd))
  i = i + n + 1
end
if ARGV[6] ~= '' then redis.call('HSET', KEYS[2], 'started', ARGV[6]) end
if maintain then
  refresh(KEYS[1], ARGV[4], ARGV[5])
  refresh(KEYS[2], ARGV[4], ARGV[5])
end
ring(KEYS[1])
return 1
"""

# KEYS: 1 output, 2 state. ARGV: 1 owner field, 2 token, 3 window_ms, 4 ttl, 5 only_unset, 6 next,
# 7 end_ms, then the end entry's field pairs. Returns 1, 0 (not ours) or -1 (the room's next is not
# this line's seq: nothing written, the owner field kept for the ack's release). ``next`` so moves
# only from this seq to the next: never back, never past a line that skipped past this one. The
# turn check is the HGET of ``next`` this script always made.
_FINISH = _PRELUDE + """
if not owned(KEYS[2], ARGV[1], ARGV[2]) then return 0 end
if not our_turn(KEYS[2], tonumber(ARGV[6]) - 1) then return -1 end
redis.call('XADD', KEYS[1], 'MINID', '~', ARGV[5] == '1' and '0' or minid(ARGV[3]), '*', unpack(ARGV, 8))
redis.call('HSET', KEYS[2], 'next', ARGV[6])
local e = tonumber(redis.call('HGET', KEYS[2], 'end_ms') or '0')
if e < tonumber(ARGV[7]) then redis.call('HSET', KEYS[2], 'end_ms', ARGV[7]) end
redis.call('HDEL', KEYS[2], ARGV[1])
refresh(KEYS[1], ARGV[4], ARGV[5])
refresh(KEYS[2], ARGV[4], ARGV[5])
ring(KEYS[1])
return 1
"""

# KEYS: 1 state. ARGV: 1 owner field, 2 token, 3 seq.
_SKIP = _PRELUDE + """
if not owned(KEYS[1], ARGV[1], ARGV[2]) then return 0 end
local n = tonumber(redis.call('HGET', KEYS[1], 'next') or '1')
if n < tonumber(ARGV[3]) then redis.call('HSET', KEYS[1], 'next', ARGV[3]) end
return 1
"""

# KEYS: 1 state. ARGV: 1 owner field, 2 token. The line is left without an owner (its job is acked next).
_RELEASE = _PRELUDE + """
if not owned(KEYS[1], ARGV[1], ARGV[2]) then return 0 end
return redis.call('HDEL', KEYS[1], ARGV[1])
"""

# The shard's pending list fences the ack and the keeper's refresh, as on one instance.
_SHARD_PRELUDE = PENDING_LUA

# KEYS: 1 shard. ARGV: 1 group, 2 entry id, 3 consumer.
_ACK = _SHARD_PRELUDE + """
if not pending_to(KEYS[1], ARGV[1], ARGV[2], ARGV[3]) then return 0 end
return redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
"""

# KEYS: 1 shard. ARGV: 1 group, 2 consumer, entry ids. Returns the ids no longer ours.
_TOUCH = _SHARD_PRELUDE + """
local lost = {}
for i = 3, #ARGV do
  if pending_to(KEYS[1], ARGV[1], ARGV[i], ARGV[2]) then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
  else
    lost[#lost + 1] = ARGV[i]
  end
end
return lost
"""

# KEYS: 1 shard. ARGV: 1 group, 2 entry id. The entry's pending record (its delivery count is
# the 4th field); raw, where a client would parse it as a summary.
_DELIVERIES = """
return redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
"""


# KEYS: 1 any key (routes it to that key's node). Redis 7.0 and later give their version; older ones nil.
_VERSION = """
return redis.REDIS_VERSION
"""


def split_entry(entry_id: str) -> tuple[int, str]:
    """``"3/1700000000000-0"`` -> ``(3, "1700000000000-0")``."""
    shard, _, stream_id = entry_id.partition("/")
    return int(shard), stream_id


def owner_field(job: Job) -> str:
    return f"owner:{job.seq}"


class ShardedJobs:
    def __init__(self, calls: ClusterCalls, consumer: str, *, shards: int, room_idle_ttl_s: int = 3600) -> None:
        """``calls``: a cluster client with text replies and a socket timeout above the longest
        blocked read. ``shards``: the deployment's ``job_shards``."""
        if shards < 1:
            raise ValueError(f"job_shards must be at least 1, not {shards}")
        self.calls = calls
        self.consumer = consumer
        self.shards = shards
        self.room_idle_ttl_s = room_idle_ttl_s
        self._first = 0
        self._held: deque[tuple[Job, int]] = deque()
        """Jobs read beyond what was asked for, with their delivery count: returned first."""
        self._blocked: dict[int, asyncio.Task[list[Job]]] = {}
        """Shard -> its blocked read, kept across calls until it answers."""
        self._tokens: dict[str, str] = {}
        """Entry id -> the owner token this worker wrote for it."""

    # -- groups and reads ------------------------------------------------------------------------

    async def ensure_groups(self) -> None:
        """The shards' consumer groups. Raises ``RuntimeError`` when a shard's node is older than
        Redis 7.0: the room scripts ring the room's bell with ``SPUBLISH`` (docs/cluster.md)."""
        for shard in range(self.shards):
            got = await self.calls.call("EVAL", _VERSION, 1, keys.job_shard(shard))
            version = got.decode() if isinstance(got, bytes) else str(got or "")
            if not version or int(version.split(".")[0]) < 7:
                raise RuntimeError(f"Redis Cluster mode needs Redis 7.0 or later (sharded pub/sub); the node of "
                                   f"{keys.job_shard(shard)} runs {version or 'an older one'} (docs/cluster.md)")
            try:
                await self.calls.call("XGROUP", "CREATE", keys.job_shard(shard), keys.JOBS_GROUP, "0", "MKSTREAM")
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    def held_ids(self) -> list[str]:
        return [job.entry_id for job, _ in self._held]

    async def read_jobs(self, count: int, block_ms: int) -> list[Job]:
        """At most ``count`` jobs of any shards, taken (see the module's docstring); waits up to
        ``block_ms`` for the first when no shard has any."""
        got: list[tuple[Job, int]] = []
        while self._held and len(got) < count:
            got.append(self._held.popleft())
        got += self._harvest(count - len(got))
        if len(got) < count:
            got += await self._poll(count - len(got))
        if not got:
            got = await self._block(count, block_ms)
        return await self._take_all(got)

    async def _poll(self, count: int) -> list[tuple[Job, int]]:
        got: list[tuple[Job, int]] = []
        first = self._first
        self._first = (first + 1) % self.shards
        for i in range(self.shards):
            shard = (first + i) % self.shards
            if shard in self._blocked or len(got) >= count:
                continue
            got += [(job, 1) for job in await self._read(shard, count - len(got), None)]
        return got

    async def _block(self, count: int, block_ms: int) -> list[tuple[Job, int]]:
        for shard in range(self.shards):
            if shard not in self._blocked:
                self._blocked[shard] = asyncio.create_task(self._read(shard, 1, block_ms),
                                                           name=f"jobs:read:{shard}")
        await asyncio.wait(set(self._blocked.values()), timeout=block_ms / 1000.0 + 0.5,
                           return_when=asyncio.FIRST_COMPLETED)
        return self._harvest(count)

    def _harvest(self, count: int) -> list[tuple[Job, int]]:
        """The answers of the blocked reads that came back; beyond ``count``, held."""
        got: list[tuple[Job, int]] = []
        for shard, task in list(self._blocked.items()):
            if not task.done():
                continue
            del self._blocked[shard]
            for job in task.result():  # a read that failed raises here, into the intake's retry
                (got if len(got) < count else self._held).append((job, 1))
        return got

    async def _read(self, shard: int, count: int, block_ms: int | None) -> list[Job]:
        stream = keys.job_shard(shard)
        block = [] if block_ms is None else ["BLOCK", max(1, block_ms)]
        try:
            resp: Any = await self.calls.call_at(stream, "XREADGROUP", "GROUP", keys.JOBS_GROUP, self.consumer,
                                                 "COUNT", count, *block, "STREAMS", stream, ">")
        except ResponseError as exc:
            # A read blocked on the node a resharding takes the shard from is answered this when
            # the shard's key leaves it (Redis 7: ``UNBLOCKED the stream key no longer exists``).
            # Nothing was delivered: the next read goes to the shard's new node.
            if not str(exc).startswith("UNBLOCKED"):
                raise
            log.info("jobs: read of shard %d unblocked (%s): read again", shard, exc)
            return []
        entries = _entries_of(resp, stream)
        return await self._parse(shard, entries)

    async def claim_stale(self, min_idle_ms: int, count: int) -> list[Job]:
        """Jobs left pending by a consumer that went quiet, of every shard in turn, taken."""
        got: list[tuple[Job, int]] = []
        for i in range(self.shards):
            if len(got) >= count:
                break
            shard = (self._first + i) % self.shards
            stream = keys.job_shard(shard)
            resp: Any = await self.calls.call("XAUTOCLAIM", stream, keys.JOBS_GROUP, self.consumer, min_idle_ms,
                                              "0-0", "COUNT", count - len(got))
            # Redis 6.2 answers [cursor, entries]; 7.x adds the ids of deleted entries.
            entries = resp[1] if len(resp) >= 2 else []
            for job in await self._parse(shard, list(entries)):
                _, stream_id = split_entry(job.entry_id)
                pending: Any = await self.calls.call("EVAL", _DELIVERIES, 1, stream, keys.JOBS_GROUP, stream_id)
                got.append((job, int(pending[0][3]) if pending else 2))
        return await self._take_all(got)

    async def _parse(self, shard: int, entries: list[Any]) -> list[Job]:
        jobs = []
        for stream_id, fields in entries:
            entry_id = f"{shard}/{stream_id}"
            if fields is None:  # trimmed away by MAXLEN while pending
                await self.drop_entry(entry_id)
                continue
            try:
                jobs.append(Job.from_entry(entry_id, _as_dict(fields)))
            except (KeyError, ValueError):
                log.warning("dropping malformed job %s: %r", entry_id, fields)
                await self.drop_entry(entry_id)
        return jobs

    # -- ownership -------------------------------------------------------------------------------

    async def _take_all(self, got: list[tuple[Job, int]]) -> list[Job]:
        taken = []
        for job, deliveries in got:
            if await self.take(job, deliveries):
                taken.append(job)
        return taken

    async def take(self, job: Job, deliveries: int) -> bool:
        """Make this worker the line's owner in the room's slot. ``False``: it is not ours (a
        duplicate of the line is acked here; a job adopted by another worker is left to it)."""
        token = f"{deliveries}|{self.consumer}|{job.entry_id}"
        done = int(await self.calls.call("EVAL", _TAKE, 1, keys.room_state(job.room), owner_field(job), token,
                                         deliveries, job.entry_id, *self._ttl_args(job)))
        if done == 1:
            self._tokens[job.entry_id] = token
            return True
        if done == -1:
            log.warning("room %s line %d: job %s is a second hand-off of a line another job owns; acked",
                        job.room, job.seq, job.entry_id)
            await self.drop_entry(job.entry_id)
        return False

    def _ttl_args(self, job: Job) -> list[Any]:
        private = job.room.startswith(keys.PRIVATE_ROOM_PREFIX)
        return [self.room_idle_ttl_s, "1" if private else "0"]

    def token(self, job: Job) -> str | None:
        return self._tokens.get(job.entry_id)

    def forget(self, entry_id: str) -> None:
        self._tokens.pop(entry_id, None)

    # -- the room's writes (room slot) and the ack (shard slot) --------------------------------

    async def publish(self, job: Job, window_ms: int, started: int | None, maintain: bool,
                      entries: list[dict[Any, Any]]) -> int:
        """1 written; 0 the line is not ours; -1 ours, but the room's ``next`` moved past its
        seq (a later line skipped past it). Nothing is written unless 1."""
        token = self.token(job)
        if token is None:
            return 0
        args: list[Any] = ["EVAL", _PUBLISH, 2, keys.room_output(job.room), keys.room_state(job.room),
                           owner_field(job), token, window_ms, *self._ttl_args(job),
                           "" if started is None else started, "1" if maintain else "0", job.seq]
        for fields in entries:
            args.append(len(fields))
            for name, value in fields.items():
                args += (name, value)
        return int(await self.calls.call(*args))

    async def finish(self, job: Job, window_ms: int, end_ms: float, end_fields: dict[str, Any]) -> int:
        """The end and the turn handover (room slot, fenced by owner and turn), then the ack
        (shard). 0: the line is not ours; -1: the room's ``next`` moved past it (the caller acks
        it with :meth:`ack`); nothing written either way. 1: done."""
        token = self.token(job)
        if token is None:
            return 0
        flat: list[Any] = []
        for name, value in end_fields.items():
            flat += [name, value]
        done = int(await self.calls.call("EVAL", _FINISH, 2, keys.room_output(job.room), keys.room_state(job.room),
                                         owner_field(job), token, window_ms, *self._ttl_args(job), job.seq + 1,
                                         f"{end_ms:.3f}", *flat))
        if done != 1:
            return done
        await self.ack_shard(job.entry_id)
        return 1

    async def skip_to(self, job: Job) -> bool:
        token = self.token(job)
        if token is None:
            return False
        return bool(await self.calls.call("EVAL", _SKIP, 1, keys.room_state(job.room), owner_field(job), token,
                                          job.seq))

    async def ack(self, job: Job) -> bool:
        """A job ended without a finish (stale, skipped): its owner field is released (room
        slot, fenced), then the job acked on its shard."""
        token = self.token(job)
        if token is None:
            return False
        if not await self.calls.call("EVAL", _RELEASE, 1, keys.room_state(job.room), owner_field(job), token):
            self.forget(job.entry_id)
            return False
        return await self.ack_shard(job.entry_id)

    async def ack_shard(self, entry_id: str) -> bool:
        self.forget(entry_id)
        shard, stream_id = split_entry(entry_id)
        return bool(await self.calls.call("EVAL", _ACK, 1, keys.job_shard(shard), keys.JOBS_GROUP, stream_id,
                                          self.consumer))

    async def drop_entry(self, entry_id: str) -> None:
        """Ack an entry that cannot become a job of ours (trimmed, malformed, a duplicate)."""
        self.forget(entry_id)
        shard, stream_id = split_entry(entry_id)
        await self.calls.call("XACK", keys.job_shard(shard), keys.JOBS_GROUP, stream_id)

    async def touch(self, entry_ids: list[str]) -> list[str]:
        """Reset the idle time of our jobs (and of the jobs held here), per shard; returns the
        ids no longer ours (held ones among them are let go)."""
        by_shard: dict[int, list[str]] = {}
        for entry_id in [*entry_ids, *self.held_ids()]:
            shard, stream_id = split_entry(entry_id)
            by_shard.setdefault(shard, []).append(stream_id)
        lost: list[str] = []
        for shard, ids in by_shard.items():
            gone: Any = await self.calls.call("EVAL", _TOUCH, 1, keys.job_shard(shard), keys.JOBS_GROUP,
                                              self.consumer, *ids)
            lost += [f"{shard}/{stream_id}" for stream_id in gone]
        for entry_id in lost:
            self.forget(entry_id)
        if lost and self._held:
            gone_ids = set(lost)
            self._held = deque(held for held in self._held if held[0].entry_id not in gone_ids)
        return lost

    async def aclose(self) -> None:
        for task in self._blocked.values():
            task.cancel()  # served or not, the entry is claimed after the claim time
        await asyncio.gather(*self._blocked.values(), return_exceptions=True)
        self._blocked.clear()


def _entries_of(resp: Any, stream: str) -> list[Any]:
    """XREADGROUP's entries of ``stream``, whichever shape (RESP2 list, RESP3 map) came back."""
    if not resp:
        return []
    if isinstance(resp, dict):
        return list(resp.get(stream, []))
    return list(resp[0][1])


def _as_dict(fields: Any) -> dict[str, str]:
    if isinstance(fields, dict):
        return {str(k): str(v) for k, v in fields.items()}
    flat = list(fields)
    return dict(zip(flat[::2], flat[1::2], strict=True))
