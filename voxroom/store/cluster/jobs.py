"""The worker's job queue on Redis Cluster: job shards read fairly, and every write in one slot.

On one Redis instance a job's writes to its room and its ``XACK`` on ``vx:jobs`` are one script,
fenced by the job stream's pending list (voxroom/store/single/jobs.py). On a cluster the room's keys and the
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
  skipped past is refused there too (``-1``: :class:`voxroom.errors.TurnLost`). The scripts are
  voxroom/store/lua/room.py's with its ``CLUSTER`` fence.
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
import time
from collections import deque
from typing import Any

from redis.exceptions import ResponseError

from voxroom.store import keys
from voxroom.store.backoff import REDIS_DOWN
from voxroom.store.cluster.calls import ClusterCalls
from voxroom.store.cluster.pipeline import ClusterAutoPipeline
from voxroom.store.interface import Fence
from voxroom.store.lua import jobs
from voxroom.store.lua.room import CLUSTER, RoomScripts
from voxroom.wire.jobs import Job

log = logging.getLogger("voxroom.worker.shards")

SCRIPTS = RoomScripts(CLUSTER)
SHARD_RETRY_S = 1.0
"""A shard whose node did not answer is left out of reads, claims and refreshes this long."""


def split_entry(entry_id: str) -> tuple[int, str]:
    """``"3/1700000000000-0"`` -> ``(3, "1700000000000-0")``."""
    shard, _, stream_id = entry_id.partition("/")
    return int(shard), stream_id


def owner_field(job: Job) -> str:
    return f"owner:{job.seq}"


class ClusterJobQueue:
    """:class:`voxroom.store.interface.JobQueue` on a cluster. ``auto``: the job bus's per-node
    autopipeline (text replies; the bus closes it); ``blocking``: routed calls on redis-py's
    per-node pools for the blocked shard reads (a socket timeout above the longest block).
    ``shards``: the deployment's ``job_shards``."""

    scripts = SCRIPTS

    def __init__(self, auto: ClusterAutoPipeline, blocking: ClusterCalls, consumer: str, *, shards: int,
                 room_idle_ttl_s: int = 3600) -> None:
        if shards < 1:
            raise ValueError(f"job_shards must be at least 1, not {shards}")
        self.calls = auto
        self.blocking = blocking
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
        self._down: dict[int, float] = {}
        """Shard -> when (monotonic) it may be asked again after its node failed to answer."""
        self._last_error: BaseException | None = None

    # -- groups and reads ------------------------------------------------------------------------

    async def ensure_groups(self) -> None:
        """The shards' consumer groups. Raises ``RuntimeError`` when a shard's node is older than
        Redis 7.0: the room scripts ring the room's bell with ``SPUBLISH`` (docs/cluster.md)."""
        for shard in range(self.shards):
            stream = keys.job_shard(shard, self.shards)
            got = await self.calls.call("EVAL", jobs.VERSION, 1, stream)
            version = got.decode() if isinstance(got, bytes) else str(got or "")
            if not version or int(version.split(".")[0]) < 7:
                raise RuntimeError(f"Redis Cluster mode needs Redis 7.0 or later (sharded pub/sub); the node of "
                                   f"{stream} runs {version or 'an older one'} (docs/cluster.md)")
            try:
                await self.calls.call("XGROUP", "CREATE", stream, keys.JOBS_GROUP, "0", "MKSTREAM")
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    def held_ids(self) -> list[str]:
        return [job.entry_id for job, _ in self._held]

    async def read(self, count: int, block_ms: int) -> list[Job]:
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

    # -- shards whose node cannot answer ------------------------------------------------------------
    # One primary down (a failover under way, a partition) must not stall the reads, claims and
    # refreshes of the shards on the others: a shard that fails is left out for SHARD_RETRY_S and
    # the others are served meanwhile; only when every shard fails does the caller back off.

    def _live(self, shard: int) -> bool:
        return self._down.get(shard, 0.0) <= time.monotonic()

    def _failed(self, shard: int, exc: BaseException) -> None:
        if self._live(shard):
            log.warning("jobs: shard %d unavailable (%s); the other shards are read meanwhile", shard, exc)
        self._down[shard] = time.monotonic() + SHARD_RETRY_S
        self._last_error = exc

    def _all_down(self) -> None:
        """Raise the last shard's error when no shard can be read now (the intake backs off)."""
        if self._last_error is not None and not any(self._live(s) for s in range(self.shards)):
            raise self._last_error

    async def _poll(self, count: int) -> list[tuple[Job, int]]:
        got: list[tuple[Job, int]] = []
        first = self._first
        self._first = (first + 1) % self.shards
        for i in range(self.shards):
            shard = (first + i) % self.shards
            if shard in self._blocked or len(got) >= count or not self._live(shard):
                continue
            try:
                got += [(job, 1) for job in await self._read(shard, count - len(got), None)]
            except REDIS_DOWN as exc:
                self._failed(shard, exc)
        if not got:
            self._all_down()
        return got

    async def _block(self, count: int, block_ms: int) -> list[tuple[Job, int]]:
        for shard in range(self.shards):
            if shard not in self._blocked and self._live(shard):
                self._blocked[shard] = asyncio.create_task(self._read(shard, 1, block_ms),
                                                           name=f"jobs:read:{shard}")
        if self._blocked:
            await asyncio.wait(set(self._blocked.values()), timeout=block_ms / 1000.0 + 0.5,
                               return_when=asyncio.FIRST_COMPLETED)
        else:  # every shard left out for now: wait for the first to be due again
            await asyncio.sleep(min(block_ms / 1000.0, SHARD_RETRY_S))
        got = self._harvest(count)
        if not got:
            self._all_down()
        return got

    def _harvest(self, count: int) -> list[tuple[Job, int]]:
        """The answers of the blocked reads that came back; beyond ``count``, held. A read that
        failed leaves its shard out for a while (the others' answers are kept)."""
        got: list[tuple[Job, int]] = []
        for shard, task in list(self._blocked.items()):
            if not task.done():
                continue
            del self._blocked[shard]
            if task.cancelled():
                continue
            error = task.exception()
            if isinstance(error, REDIS_DOWN):
                self._failed(shard, error)
                continue
            for job in task.result():  # anything else raises here, into the intake
                (got if len(got) < count else self._held).append((job, 1))
        return got

    async def _read(self, shard: int, count: int, block_ms: int | None) -> list[Job]:
        stream = keys.job_shard(shard, self.shards)
        block = [] if block_ms is None else ["BLOCK", max(1, block_ms)]
        try:
            resp: Any = await self.blocking.call_at(stream, "XREADGROUP", "GROUP", keys.JOBS_GROUP, self.consumer,
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
            if not self._live(shard):
                continue
            stream = keys.job_shard(shard, self.shards)
            try:
                resp: Any = await self.calls.call("XAUTOCLAIM", stream, keys.JOBS_GROUP, self.consumer, min_idle_ms,
                                                  "0-0", "COUNT", count - len(got))
                # Redis 6.2 answers [cursor, entries]; 7.x adds the ids of deleted entries.
                entries = resp[1] if len(resp) >= 2 else []
                for job in await self._parse(shard, list(entries)):
                    _, stream_id = split_entry(job.entry_id)
                    pending: Any = await self.calls.call("EVAL", jobs.DELIVERIES, 1, stream, keys.JOBS_GROUP,
                                                         stream_id)
                    got.append((job, int(pending[0][3]) if pending else 2))
            except REDIS_DOWN as exc:
                self._failed(shard, exc)
        if not got:
            self._all_down()
        return await self._take_all(got)

    async def _parse(self, shard: int, entries: list[Any]) -> list[Job]:
        jobs = []
        for stream_id, fields in entries:
            entry_id = f"{shard}/{stream_id}"
            if fields is None:  # trimmed away by MAXLEN while pending
                await self.drop(entry_id)
                continue
            try:
                jobs.append(Job.from_entry(entry_id, _as_dict(fields)))
            except (KeyError, ValueError):
                log.warning("dropping malformed job %s: %r", entry_id, fields)
                await self.drop(entry_id)
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
        done = int(await self.calls.call("EVAL", jobs.TAKE, 1, keys.room_state(job.room), owner_field(job), token,
                                         deliveries, job.entry_id, *self._ttl_args(job)))
        if done == 1:
            self._tokens[job.entry_id] = token
            return True
        if done == -1:
            log.warning("room %s line %d: job %s is a second hand-off of a line another job owns; acked",
                        job.room, job.seq, job.entry_id)
            await self.drop(job.entry_id)
        return False

    def _ttl_args(self, job: Job) -> list[Any]:
        private = job.room.startswith(keys.PRIVATE_ROOM_PREFIX)
        return [self.room_idle_ttl_s, "1" if private else "0"]

    # -- the fence and the ack (shard slot) -----------------------------------------------------

    def fence(self, job: Job) -> Fence | None:
        token = self._tokens.get(job.entry_id)
        return None if token is None else Fence(keys.room_state(job.room), owner_field(job), token)

    async def done(self, job: Job) -> bool:
        return await self.ack_shard(job.entry_id)

    def forget(self, entry_id: str) -> None:
        self._tokens.pop(entry_id, None)

    async def ack_shard(self, entry_id: str) -> bool:
        self.forget(entry_id)
        shard, stream_id = split_entry(entry_id)
        stream = keys.job_shard(shard, self.shards)
        return bool(await self.calls.call("EVAL", jobs.ACK, 1, stream, keys.JOBS_GROUP, stream_id,
                                          self.consumer))

    async def drop(self, entry_id: str) -> None:
        """Ack an entry that cannot become a job of ours (trimmed, malformed, a duplicate)."""
        self.forget(entry_id)
        shard, stream_id = split_entry(entry_id)
        await self.calls.call("XACK", keys.job_shard(shard, self.shards), keys.JOBS_GROUP, stream_id)

    async def touch(self, entry_ids: list[str]) -> list[str]:
        """Reset the idle time of our jobs (and of the jobs held here), per shard; returns the
        ids no longer ours (held ones among them are let go)."""
        by_shard: dict[int, list[str]] = {}
        for entry_id in [*entry_ids, *self.held_ids()]:
            shard, stream_id = split_entry(entry_id)
            by_shard.setdefault(shard, []).append(stream_id)
        lost: list[str] = []
        shards = list(by_shard)
        # Every shard at once, each on its own: a shard whose node is down keeps its jobs (they are
        # not lost, only not refreshed now); the others' jobs are refreshed, never left to a claim.
        answers = await asyncio.gather(*(self.calls.call("EVAL", jobs.TOUCH, 1, keys.job_shard(shard, self.shards),
                                                         keys.JOBS_GROUP, self.consumer, *by_shard[shard])
                                         for shard in shards), return_exceptions=True)
        failures = 0
        for shard, gone in zip(shards, answers, strict=True):
            if isinstance(gone, BaseException):
                if not isinstance(gone, REDIS_DOWN):
                    raise gone
                self._failed(shard, gone)
                failures += 1
                continue
            lost += [f"{shard}/{stream_id}" for stream_id in gone]
        if shards and failures == len(shards):
            raise self._last_error or RuntimeError("no shard answered")
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
        await self.blocking.aclose()


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
