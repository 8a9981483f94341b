"""The worker's job bus: take jobs, keep them claimed, publish audio, keep room order. Written
once, over the mode's :class:`~voxroom.store.interface.JobQueue` (one ``vx:jobs`` on one Redis,
voxroom/store/single/jobs.py; job shards on a cluster, voxroom/store/cluster/jobs.py).

All the Redis commands a worker sends for its jobs go through here, so that the pool and the
publisher can be read without knowing the key layout.

**Every write for a job is fenced** (voxroom/store/lua/room.py): its slices, its ``end`` and turn
handover, a skip past a late predecessor, its ack. A worker that lost its job (paused past the
claim time) finds its writes refused by Redis, atomically with the check, and drops the job
(:class:`~voxroom.errors.OwnershipLost`). The slices and the ``end`` are also refused when the
room's ``next`` is no longer the job's seq (a later line skipped past it):
:class:`~voxroom.errors.TurnLost`, the line dropped as stale and acked.

**Publishes are batched.** The publishes of every room issued in one loop turn (a paced tick's
slices) leave as one script per slot: on one Redis one script for all of them, on a cluster one
per room (rooms lie in slots of their own). Each job is still fenced on its own.

**Room keys expire.** An utterance's first publish, then one a second, and its finish refresh
``EXPIRE room_idle_ttl_s`` on the room's output stream and state hash, and trim the output stream
by time (``XADD ... MINID ~`` the resume window) instead of by a count: a room nobody speaks in for
an hour leaves nothing behind. Private API rooms (``_api-*``) get a TTL only when they have none.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError, ResponseError

from voxroom.errors import LineCancelled, OwnershipLost, TurnLost
from voxroom.store import keys
from voxroom.store.autopipe import redis_error
from voxroom.store.entry_ids import entry_id_str
from voxroom.store.interface import Commands, Fence, JobQueue, StreamWatch, Turn
from voxroom.wire.jobs import Job
from voxroom.wire.output_entries import AUDIENCE_FIELD, slice_count

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
_MAINTAINED_MAX = 4096
SLICES_LOOKED_AT = 400
"""Output entries :meth:`FencedJobBus.published_slices` reads back at most (16 s of slices in pairs)."""


class _Publish(NamedTuple):
    """One job's entries waiting for the loop turn's publish script."""
    job: Job
    fence: Fence
    entries: list[dict[Any, Any]]
    started: int | None
    maintain: bool
    final: bool
    """The slice that ends a cancelled line: written although the line is cancelled."""
    done: asyncio.Future[int]
    """The script's reply for the job: 1 written, 0 no longer ours, -1 its turn is gone, -2 its
    line was cancelled."""


class FencedJobBus:
    """Made by the store (``Store.job_bus``). Owns what it is given and closes it
    (:meth:`close`): ``queue``, the mode's job queue; ``auto`` (text) and ``raw`` (bytes: output
    entries carry audio), pipelines; ``watcher``, the worker's one turn watcher, whose loop
    (``watcher.run``) the worker runs under its supervisor. ``slot_of``: the store's."""

    def __init__(self, queue: JobQueue, auto: Commands, raw: Commands, watcher: StreamWatch,
                 slot_of: Callable[[str], int], *,
                 resume_window_ms: int = 120_000, room_idle_ttl_s: int = 3600) -> None:
        self.queue = queue
        self.scripts = queue.scripts
        self.auto = auto
        self.raw = raw
        self._watcher = watcher
        self._slot_of = slot_of
        self.resume_window_ms = resume_window_ms
        self.room_idle_ttl_s = room_idle_ttl_s
        self._publishes: list[_Publish] = []
        """Publishes issued in this loop turn, sent together by :meth:`_send_publishes`."""
        self._publish_scheduled = False
        self._closed = False
        self._maintained: dict[str, float] = {}
        """Job entry id -> when its publishes last trimmed and refreshed the room's keys. An
        entry leaves on the job's finish or lost ownership; the bound covers any other end."""

    @property
    def watcher(self) -> StreamWatch:
        return self._watcher

    # -- jobs --------------------------------------------------------------------------------------

    async def ensure_group(self) -> None:
        await self.queue.ensure_groups()

    async def read_jobs(self, count: int, block_ms: int) -> list[Job]:
        """New jobs for this consumer, at most ``count``; waits up to ``block_ms`` for the first."""
        return await self.queue.read(count, block_ms)

    async def claim_stale(self, min_idle_ms: int, count: int) -> list[Job]:
        """Jobs left pending by a consumer that went quiet (a dead worker), now ours."""
        return await self.queue.claim_stale(min_idle_ms, count)

    async def touch(self, entry_ids: list[str]) -> list[str]:
        """Reset the idle time of jobs we are still working on, so nobody claims them from us.
        Returns the ids that are no longer ours: the caller drops those jobs."""
        return await self.queue.touch(entry_ids) if entry_ids else []

    async def ack(self, job: Job) -> bool:
        """Ack ``job`` (ended without a finish: stale, skipped) if it is still ours (``False``:
        another worker owns it; nothing done)."""
        fence = self.queue.fence(job)
        if fence is None:
            return False
        if not await self.auto.call("EVAL", self.scripts.release, 2, fence.key, keys.room_state(job.room),
                                    fence.a, fence.b):
            self.queue.forget(job.entry_id)
            return False
        return await self.queue.done(job)

    async def skip_to(self, job: Job) -> None:
        """Let ``job`` play even though an earlier utterance never finished (it waited too long).
        Raises :class:`OwnershipLost` when ``job`` is no longer ours."""
        fence = self.queue.fence(job)
        if fence is None or not await self.auto.call("EVAL", self.scripts.skip, 2, fence.key,
                                                     keys.room_state(job.room), fence.a, fence.b, job.seq):
            raise OwnershipLost(job.entry_id)

    # -- room order --------------------------------------------------------------------------------

    async def room_turn(self, room: str) -> Turn:
        """Where the room's playback stands, and whether any client wants Opus (one round trip)."""
        (nxt, end_ms, started, cancelled), opus = await self.auto.group([
            ("HMGET", keys.room_state(room), "next", "end_ms", "started", "cancelled"),
            ("EXISTS", keys.room_opus_demand(room))])
        return Turn(int(nxt or 1), float(end_ms or 0.0), int(started or 0), bool(opus),
                    frozenset(int(n) for n in str(cancelled).split()) if cancelled else frozenset())

    async def output_tail(self, room: str) -> str:
        last: Any = await self.raw.call("XREVRANGE", keys.room_output(room), "+", "-", "COUNT", 1)
        return entry_id_str(last[0][0]) if last else "0-0"

    async def published_slices(self, room: str, seq: int) -> int:
        """How many slices of line ``seq`` the room's output stream holds, by the newest of its
        ``chunk`` entries among the last :data:`SLICES_LOOKED_AT` (a line begun by a worker that
        died, cancelled since: where it ends)."""
        entries: Any = await self.raw.call("XREVRANGE", keys.room_output(room), "+", "-", "COUNT", SLICES_LOOKED_AT)
        wanted = str(seq).encode()
        for _entry_id, flat in entries:
            fields = dict(zip(flat[::2], flat[1::2], strict=True))
            if fields.get(b"kind") == b"chunk" and fields.get(b"seq") == wanted:
                return int(fields[b"chunk"]) + slice_count(fields)
        return 0

    async def wait_output(self, room: str, after_id: str, block_ms: int) -> str:
        """Until the room's output stream has an entry after ``after_id``; the new tail. Through
        the worker's one turn watcher (no connection of its own)."""
        return await self._watcher.wait(room, after_id, max(1, block_ms) / 1000.0)

    # -- an open line's pieces -----------------------------------------------------------------------

    async def read_pieces(self, job: Job, after_id: str, count: int) -> list[tuple[str, dict[str, str]]]:
        key = keys.open_line(job.room, job.sender, job.open_seq)
        entries: Any = await self.raw.call("XRANGE", key, "(" + after_id, "+", "COUNT", count)
        return [(entry_id_str(entry_id), {_text(k): _text(v) for k, v in zip(flat[::2], flat[1::2], strict=True)})
                for entry_id, flat in entries or ()]

    async def close_idle_line(self, job: Job, last_id: str) -> bool:
        closed: Any = await self.auto.call("EVAL", self.scripts.close_idle, 2,
                                           keys.open_line(job.room, job.sender, job.open_seq),
                                           keys.room_output(job.room), last_id, self.room_idle_ttl_s)
        return bool(int(closed))

    async def drop_line(self, job: Job) -> None:
        await self.auto.call("DEL", keys.open_line(job.room, job.sender, job.open_seq))

    # -- output ------------------------------------------------------------------------------------

    async def publish(self, job: Job, entries: list[dict[Any, Any]], *, started: int | None = None,
                      final: bool = False) -> None:
        """Append output entries for ``job``; ``started``: also record that this seq's start went
        out. Nothing is written unless ``job`` is still ours (:class:`OwnershipLost`), the
        room's ``next`` is still its seq (:class:`TurnLost`) and its line was not cancelled
        (:class:`LineCancelled`; ``final``: the slice that ends a cancelled line, written anyway)."""
        fence = self.queue.fence(job)
        if fence is None:
            raise OwnershipLost(job.entry_id)
        if job.to:
            entries = [_addressed(fields, job) for fields in entries]
        await self.auto.capacity()
        loop = asyncio.get_running_loop()
        item = _Publish(job, fence, entries, started, self._due(job), final, loop.create_future())
        self._publishes.append(item)
        if not self._publish_scheduled:
            # Called back after every task woken in this loop turn (a tick's publishers) queued its own.
            self._publish_scheduled = True
            loop.call_soon(self._send_publishes)
        self._raise_refused(await item.done, job)

    def _send_publishes(self) -> None:
        self._publish_scheduled = False
        queued, self._publishes = self._publishes, []
        by_slot: dict[int, list[_Publish]] = {}
        for item in queued:
            by_slot.setdefault(self._slot_of(keys.room_state(item.job.room)), []).append(item)
        for items in by_slot.values():
            batch: list[_Publish] = []
            entries = 0
            for item in items:
                if batch and (len(batch) >= PUBLISH_BATCH_JOBS
                              or entries + len(item.entries) > PUBLISH_BATCH_ENTRIES):
                    self._send_publish_batch(batch)
                    batch, entries = [], 0
                batch.append(item)
                entries += len(item.entries)
            if batch:
                self._send_publish_batch(batch)
        # This callback runs after every publisher of the loop turn queued its publish: the
        # scripts leave now, not one more loop turn later (a first slice's way to the room).
        self.auto.flush()

    def _send_publish_batch(self, batch: list[_Publish]) -> None:
        script_keys: list[Any] = [batch[0].fence.key]
        argv: list[Any] = [self.resume_window_ms, self.room_idle_ttl_s]
        for item in batch:
            job = item.job
            script_keys += (keys.room_output(job.room), keys.room_state(job.room))
            private = job.room.startswith(keys.PRIVATE_ROOM_PREFIX)
            argv += (item.fence.a, item.fence.b, job.seq, "1" if private else "0",
                     "" if item.started is None else item.started, "1" if item.maintain else "0",
                     "1" if item.final else "0", len(item.entries))
            for fields in item.entries:
                argv.append(len(fields))
                for name, value in fields.items():
                    argv += (name, value)
        sent = self.auto.submit([("EVAL", self.scripts.publish, len(script_keys), *script_keys, *argv)])
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

    async def finish(self, job: Job, end_fields: dict[str, Any], end_ms: float, *, cut: bool = False) -> None:
        """Publish the ``end`` entry, pass the room's turn on and ack the job, only while ``job``
        is ours (:class:`OwnershipLost` otherwise) and the room's ``next`` is still its seq
        (:class:`TurnLost` otherwise: nothing written, the caller acks it). ``next`` moves from its
        seq to the one after, never back and never past the line that skipped; ``end_ms`` only
        moves forward. A cancelled line's end is refused (:class:`LineCancelled`) unless ``cut``
        (the ``end`` ``cancelled`` at its cut)."""
        self._maintained.pop(job.entry_id, None)  # the end always trims and refreshes
        fence = self.queue.fence(job)
        if fence is None:
            raise OwnershipLost(job.entry_id)
        flat: list[Any] = []
        for name, value in (_addressed(end_fields, job) if job.to else end_fields).items():
            flat += [name, value]
        private = job.room.startswith(keys.PRIVATE_ROOM_PREFIX)
        done: Any = await self.auto.call(
            "EVAL", self.scripts.finish, 3, fence.key, keys.room_output(job.room), keys.room_state(job.room),
            fence.a, fence.b, self.resume_window_ms, self.room_idle_ttl_s, "1" if private else "0", job.seq + 1,
            f"{end_ms:.3f}", "1" if cut else "0", *flat)
        self._raise_refused(int(done), job)
        await self.queue.done(job)

    async def pass_turn(self, job: Job) -> None:
        """A line cancelled before anything of it was written: the room's ``next`` moves past it
        in its turn and the job is done, with no ``start`` and no ``end`` in the room.
        :class:`OwnershipLost` / :class:`TurnLost` as :meth:`finish`."""
        self._maintained.pop(job.entry_id, None)
        fence = self.queue.fence(job)
        if fence is None:
            raise OwnershipLost(job.entry_id)
        done: Any = await self.auto.call(
            "EVAL", self.scripts.pass_turn, 3, fence.key, keys.room_output(job.room), keys.room_state(job.room),
            fence.a, fence.b, job.seq)
        self._raise_refused(int(done), job)
        await self.queue.done(job)

    def _raise_refused(self, reply: int, job: Job) -> None:
        """A write script's reply for ``job``: 1 written; 0 :class:`OwnershipLost`; -1
        :class:`TurnLost` (still ours: the caller acks it); -2 :class:`LineCancelled` (still ours
        and its turn). A refused job's maintenance record
        goes (no more writes follow)."""
        if reply == 1:
            return
        self._maintained.pop(job.entry_id, None)
        if reply == -1:
            raise TurnLost(f"{job.entry_id}: room {job.room} moved past seq {job.seq}")
        if reply == -2:
            raise LineCancelled(f"{job.entry_id}: room {job.room} seq {job.seq} was cancelled")
        self.queue.forget(job.entry_id)
        raise OwnershipLost(job.entry_id)

    # -- worker registry ---------------------------------------------------------------------------

    async def heartbeat(self, worker_id: str, fields: dict[Any, Any], ttl_s: int, now_ms: int) -> None:
        """The heartbeat hash (with its TTL) and this worker's entry in the ``vx:workers``
        registry; entries older than ``ttl_s`` (workers that died without a word) are pruned.
        Ordered, not atomic: during an OOM the hash's TTL is still refreshed (EXPIRE is allowed
        then), so a worker alive through an outage does not vanish from the directory."""
        key = keys.worker_heartbeat(worker_id)
        flat: list[Any] = []
        for name, value in fields.items():
            flat += [name, value]
        await self.auto.group([("HSET", key, *flat), ("EXPIRE", key, ttl_s),
                               ("ZADD", keys.WORKERS, now_ms, worker_id),
                               ("ZREMRANGEBYSCORE", keys.WORKERS, "-inf", f"({now_ms - ttl_s * 1000}")])

    async def drop_heartbeat(self, worker_id: str) -> None:
        await self.auto.group([("DEL", keys.worker_heartbeat(worker_id)), ("ZREM", keys.WORKERS, worker_id)])

    async def close(self) -> None:
        """Close everything the bus holds (the watcher first: its wake stream is deleted through
        ``auto``). Idempotent."""
        if self._closed:
            return
        self._closed = True
        await self._watcher.aclose()
        await self.queue.aclose()
        await self.auto.aclose()
        await self.raw.aclose()


def _addressed(fields: dict[Any, Any], job: Job) -> dict[Any, Any]:
    """An output entry of a private line, with its audience (``to``: the ``say``'s ids and the
    sender's), which gateways deliver it to only (voxroom/wire/output_entries.py ``audience``). An
    entry addressed already (a ``flushed`` answer, for the sender alone) keeps its own."""
    if AUDIENCE_FIELD in fields:
        return fields
    return {**fields, AUDIENCE_FIELD: " ".join(sorted({*job.to, job.sender}))}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
