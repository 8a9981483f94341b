"""The worker process: Redis consumer-group reader feeding the context pool.

One asyncio loop per worker process runs: the job reader (reads only as many jobs as the pool has
room for, so the rest stay in Redis for other workers), one runner per context, one publisher per
utterance in flight, a heartbeat, a keeper that re-claims our own in-flight jobs so that nobody
steals them, and a claimer that adopts jobs a dead worker left pending (``XAUTOCLAIM``).

Shutdown order: stop reading, let utterances in flight finish within ``shutdown_timeout_s``, hand
back the rest (they stay pending in Redis and another worker claims them), drop the heartbeat.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Coroutine
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from voxroom import keys
from voxroom.backoff import REDIS_DOWN, Backoff
from voxroom.clock import RoomClock
from voxroom.gc_tuning import freeze_startup_objects
from voxroom.metrics import context_fields
from voxroom.voices import Catalog
from workers.bus import WorkerBus
from workers.cache import AudioCache
from workers.context import Context
from workers.job import Job, SliceBuffer, Utterance
from workers.pool import ContextPool
from workers.publisher import PublishResult, publish_utterance

log = logging.getLogger("voxroom.worker")
HEARTBEAT_S = 2.0
HEARTBEAT_TTL_S = 10


class Worker:
    def __init__(self, redis: Redis, pool: ContextPool, catalog: Catalog, *, worker_id: str | None = None,
                 lead_ms: float = 120.0, order_wait_ms: float = 30_000.0, claim_idle_ms: int = 5_000,
                 output_maxlen: int = 3000, shutdown_timeout_s: float = 10.0,
                 clock: RoomClock | None = None, opus_bitrate: int = 0, cache_slots: int = 0,
                 cache_entry_max_bytes: int = 480_000, cache_ttl_s: int = 86_400,
                 cache_lru_entries: int = 64) -> None:
        self.id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.redis = redis
        self.bus = WorkerBus(redis, self.id, output_maxlen=output_maxlen)
        self.pool = pool
        self.catalog = catalog
        self.clock = clock or RoomClock()
        self.lead_ms = lead_ms
        self.order_wait_ms = order_wait_ms
        self.claim_idle_ms = claim_idle_ms
        self.shutdown_timeout_s = shutdown_timeout_s
        self.inflight: dict[str, Utterance] = {}
        self._owner: dict[str, Context] = {}
        self._publishers: set[asyncio.Task[None]] = set()
        self._capacity = asyncio.Event()
        self._stopping = asyncio.Event()
        self.published = 0
        self.optional_engines: frozenset[str] = frozenset()
        """Engines that may fail to load without failing the worker (``auto``'s ChatTTS)."""
        self.opus_bitrate = opus_bitrate if opus_bitrate > 0 and _has_pyav() else 0
        if opus_bitrate > 0 and not self.opus_bitrate:
            log.warning("PyAV is not installed: publishing PCM only (pip install 'voxroom[opus]')")
        self.cache = (AudioCache(self.bus.raw, slots=cache_slots, entry_max_bytes=cache_entry_max_bytes,
                                 ttl_s=cache_ttl_s, lru_entries=cache_lru_entries) if cache_slots > 0 else None)
        for ctx in pool.contexts:
            ctx.cache = self.cache

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        await self.bus.ensure_group()
        for ctx in self.pool.contexts:
            await ctx.load_engines(self.optional_engines)
        self.pool.engines_loaded()
        freeze_startup_objects()
        log.info("worker %s ready: %d contexts (%s), engines %s", self.id, len(self.pool.contexts),
                 ", ".join(c.device for c in self.pool.contexts), sorted(self.pool.engine_names()))
        background = [self._task(ctx.run(self._on_started), f"worker:{ctx.name}:runner")
                      for ctx in self.pool.contexts]
        background += [self._task(self._heartbeat(), "worker:heartbeat"),
                       self._task(self._keep_claimed(), "worker:keep-claimed"),
                       self._task(self._claim_stale(), "worker:claim-stale")]
        if self.cache is not None:
            background.append(self._task(self.cache.run_stores(), "worker:cache-stores"))
        reader = self._task(self._read_loop(), "worker:reader")
        try:
            await self._stopping.wait()
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            await self._drain()
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            try:
                await self.bus.drop_heartbeat(self.id)
            except (RedisConnectionError, RedisTimeoutError, OSError):
                pass
            self.pool.close()
            if self.cache is not None:
                await self.cache.aclose()
            await self.bus.close()
            log.info("worker %s stopped", self.id)

    async def _drain(self) -> None:
        if not self._publishers:
            return
        log.info("worker %s: waiting up to %.0f s for %d utterances in flight", self.id,
                 self.shutdown_timeout_s, len(self._publishers))
        _, pending = await asyncio.wait(set(self._publishers), timeout=self.shutdown_timeout_s)
        for task in pending:
            task.cancel()
        for utt in self.inflight.values():
            utt.cancel.set()  # unacked: another worker claims them after claim_idle_ms
        await asyncio.gather(*pending, return_exceptions=True)

    def _task(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(coro, name=name)
        task.add_done_callback(self._surface)
        return task

    @staticmethod
    def _surface(task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("task %s failed", task.get_name(), exc_info=task.exception())

    # -- intake ----------------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        backoff = Backoff()
        while True:
            free = self.pool.free()
            if free == 0:
                self._capacity.clear()
                await self._capacity.wait()
                continue
            try:
                jobs = await self.bus.read_jobs(count=free, block_ms=2000)
                backoff.reset()
            except REDIS_DOWN as exc:
                log.warning("worker %s: redis unavailable (%s); retrying in %.1f s", self.id, exc, backoff.delay)
                await backoff.wait()
                continue
            except ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                # Redis came back without our consumer group (it keeps no data): make it again.
                log.warning("worker %s: consumer group gone (redis restarted empty); recreating", self.id)
                await self.bus.ensure_group()
                continue
            for job in jobs:
                self._accept(job)

    def _accept(self, job: Job) -> None:
        utt = Utterance(job=job, slices=SliceBuffer(asyncio.get_running_loop()), read_ms=self.clock.now_ms())
        self.inflight[job.entry_id] = utt
        voice = self.catalog.get(job.voice) if job.voice in self.catalog else None
        if voice is None or not self.pool.serves(voice.engine):
            # Keep the room's order moving: publish an empty, failed utterance in its turn.
            utt.error = f"voice {job.voice!r} is not served by this worker"
            utt.slices.close()
            self._start_publisher(utt, None)
            return
        self._owner[job.entry_id] = self.pool.submit(utt)

    def _on_started(self, utt: Utterance) -> None:
        self._start_publisher(utt, self._owner.get(utt.job.entry_id))

    def _start_publisher(self, utt: Utterance, ctx: Context | None) -> None:
        task = self._task(self._publish(utt, ctx), f"room:{utt.job.room}:utt:{utt.job.seq}")
        self._publishers.add(task)
        task.add_done_callback(self._publishers.discard)

    async def _publish(self, utt: Utterance, ctx: Context | None) -> None:
        job = utt.job
        try:
            # Private API rooms (POST /v1/audio/speech): nobody plays them in real time, and the
            # gateway encodes the response itself, so neither pacing nor an Opus copy.
            private = job.room.startswith(keys.PRIVATE_ROOM_PREFIX)
            result = await publish_utterance(self.bus, utt, self.clock, lead_ms=self.lead_ms,
                                             order_wait_ms=self.order_wait_ms, voice_name=job.voice,
                                             opus_bitrate=0 if private else self.opus_bitrate, paced=not private)
            await self.bus.ack(job.entry_id)
            self.published += 1
            _log_stages(utt, result)
        finally:
            self.inflight.pop(job.entry_id, None)
            self._owner.pop(job.entry_id, None)
            if ctx is not None:
                ctx.release()
            self._capacity.set()

    # -- upkeep ----------------------------------------------------------------------------------

    async def _heartbeat(self) -> None:
        while True:
            try:
                await self.bus.heartbeat(self.id, {
                    "engines": ",".join(sorted(self.pool.engine_names())),
                    "voices": ",".join(sorted(v.id for v in self.catalog if v.engine in self.pool.engine_names())),
                    "contexts": ",".join(c.device for c in self.pool.contexts),
                    "load": self.pool.load(), "free": self.pool.free(), "published": self.published,
                    "rtf": f"{_rtf(self.pool):.3f}", "pid": os.getpid(), "time_ms": int(time.time() * 1000),
                    **context_fields(self.pool.contexts),
                    **(self.cache.stats.fields() if self.cache is not None else {}),
                }, HEARTBEAT_TTL_S)
            except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
                log.warning("worker %s: heartbeat failed: %s", self.id, exc)
            await asyncio.sleep(HEARTBEAT_S)

    async def _keep_claimed(self) -> None:
        while True:
            await asyncio.sleep(self.claim_idle_ms / 3000.0)
            try:
                await self.bus.touch(list(self.inflight))
            except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
                log.warning("worker %s: could not refresh claims: %s", self.id, exc)

    async def _claim_stale(self) -> None:
        while True:
            await asyncio.sleep(self.claim_idle_ms / 2000.0)
            free = self.pool.free()
            if free == 0:
                continue
            try:
                jobs = await self.bus.claim_stale(self.claim_idle_ms, free)
            except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
                log.warning("worker %s: claim failed: %s", self.id, exc)
                continue
            for job in jobs:
                if job.entry_id not in self.inflight:
                    log.warning("worker %s claimed room %s utterance %d from a silent consumer",
                                self.id, job.room, job.seq)
                    self._accept(job)


def _log_stages(utt: Utterance, result: PublishResult) -> None:
    """One line per utterance with where its time to first audio went: the gateway's accept to
    this worker's read, the read to the engine's call (context queue, cache lookup, hand-off), the
    engine's own first chunk, and the first chunk to the first slice published. The first is
    against the gateway's whole-millisecond stamp; the others are this process's clock."""
    job, first_slice_ms = utt.job, result.first_slice_ms

    def ms(value: float | None) -> str:
        return f"{value:.1f}" if value is not None else "-"

    started, chunk = utt.synth_started_ms, utt.engine_first_chunk_ms
    ttfa = first_slice_ms - job.time_ms if first_slice_ms else None
    read = utt.read_ms - job.time_ms if utt.read_ms else None
    to_engine = started - utt.read_ms if started and utt.read_ms else None
    to_published = (first_slice_ms - started - chunk if first_slice_ms and started and chunk is not None
                    else None)
    log.info("room %s utterance %d %s: %d slices, time to first audio %s ms (read %s, to engine %s, engine "
             "first chunk %s, to published %s), %d late shifts", job.room, job.seq, result.status, result.chunks,
             ms(ttfa), ms(read), ms(to_engine), ms(chunk), ms(to_published), result.late_shifts)


def _rtf(pool: ContextPool) -> float:
    audio = sum(c.audio_seconds for c in pool.contexts)
    return sum(c.synth_seconds for c in pool.contexts) / audio if audio else 0.0


def _has_pyav() -> bool:
    import importlib.util

    return importlib.util.find_spec("av") is not None
