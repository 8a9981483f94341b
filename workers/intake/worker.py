"""The worker process: Redis consumer-group intake feeding the context pool.

One asyncio loop per worker process runs, each loop under one :class:`voxroom.runtime.supervisor.Supervisor`
(restarted with backoff when it raises, its liveness in the heartbeat):

- ``intake``: the one loop that takes jobs (arq's ``_poll_iteration``). Between reads it claims
  jobs a dead worker left pending (``XAUTOCLAIM``); each read asks for what the pool has room for
  right now, so the rest stay in Redis for other workers; a job enters ``inflight`` only once a
  context holds it. With one loop deciding, two intake paths never race for the same capacity:
  when the pool is full it waits for room to open (a job leaving a context's queue, not the end of
  a whole line's playback) and reads again at once.
- ``context:<name>``: one runner per context (synthesis on the context's thread).
- ``keeper``: refreshes the idle time of our jobs so nobody claims them from a live worker, and
  drops the jobs Redis says are no longer ours (this worker was paused past the claim time).
- ``heartbeat``: ``vx:worker:{id}`` (with loop liveness: ``loops_down``, ``loop_restarts``) and
  this worker's entry in the ``vx:workers`` registry.
- ``turns``: one blocked ``XREAD`` over the output streams of the rooms where an utterance waits
  for its turn (``voxroom/store/single/watcher.py``), instead of one pooled blocking read per waiting utterance.
- ``cache:stores``: the audio cache's writer, when the cache is on.

Plus one publisher task per utterance in flight, and, when ``metrics_port`` is set, the
process's own ``GET /metrics`` (workers/intake/metrics.py, workers/intake/metrics_http.py): an asyncio server on
this loop, started before anything else and closed last. Every loop treats ``REDIS_DOWN`` (connection
lost, timeout, ``LOADING``, ``OOM``, ``READONLY``...) as "back off and retry", never as death.

Shutdown order: stop intake, let utterances in flight finish within ``shutdown_timeout_s``, hand
back the rest (they stay pending in Redis and another worker claims them), drop the heartbeat.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import time
import uuid
from collections.abc import Coroutine
from typing import Any

from redis.exceptions import ResponseError

from voxroom.errors import OwnershipLost
from voxroom.runtime.gc_tuning import freeze_startup_objects
from voxroom.runtime.metrics import context_fields
from voxroom.runtime.supervisor import Supervisor
from voxroom.store import keys
from voxroom.store.backoff import RECONNECT_CAP_S, REDIS_DOWN, Backoff
from voxroom.store.interface import Store
from voxroom.voices.catalog import Catalog
from voxroom.wire.jobs import Job
from workers.audio_cache.cache import AudioCache
from workers.intake.metrics import observe_utterance, stage_seconds, worker_registry
from workers.intake.metrics_http import MetricsServer
from workers.intake.stopping import unless_stopped
from workers.output.clock import RoomClock
from workers.output.publisher import PublishResult, publish_utterance
from workers.pool import open_line
from workers.pool.context import Context
from workers.pool.pool import ContextPool
from workers.utterance import SliceBuffer, Utterance

log = logging.getLogger("voxroom.worker")
HEARTBEAT_S = 2.0
HEARTBEAT_TTL_S = 10
READ_BLOCK_MS = 2000
"""Longest blocked ``XREADGROUP``; shorter when a claim pass is due sooner."""


class Worker:
    def __init__(self, store: Store, pool: ContextPool, catalog: Catalog, *, worker_id: str | None = None,
                 lead_ms: float = 120.0, order_wait_ms: float = 30_000.0, claim_idle_ms: int = 5_000,
                 resume_window_ms: int = 120_000, room_idle_ttl_s: int = 3600, open_line_idle_s: float = 10.0,
                 shutdown_timeout_s: float = 10.0, clock: RoomClock | None = None, opus_bitrate: int = 0,
                 cache_slots: int = 0, cache_entry_max_bytes: int = 480_000, cache_ttl_s: int = 86_400,
                 cache_lru_entries: int = 64, metrics_port: int = 0, metrics_host: str = "127.0.0.1") -> None:
        """``store``: the Redis this worker serves (its owner opened it and closes it after
        :meth:`run`); everything the worker writes there goes through its job bus and cache."""
        self.id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.store = store
        self.bus = store.job_bus(self.id, resume_window_ms=resume_window_ms, room_idle_ttl_s=room_idle_ttl_s)
        self.watcher = self.bus.watcher
        """Every line waiting for its room's turn shares this one watcher (its loop: ``turns``)."""
        self.pool = pool
        self.catalog = catalog
        self.clock = clock or RoomClock()
        self.lead_ms = lead_ms
        self.order_wait_ms = order_wait_ms
        self.claim_idle_ms = claim_idle_ms
        self.shutdown_timeout_s = shutdown_timeout_s
        self.inflight: dict[str, Utterance] = {}
        """Jobs a context (or, for a voice we do not serve, a publisher) holds, by entry id."""
        self._owner: dict[str, Context] = {}
        self._publishers: dict[str, asyncio.Task[None]] = {}
        self._feeds: dict[str, asyncio.Task[None]] = {}
        """Open lines' feeds (workers/pool/open_line.py), by entry id: each ends with its line."""
        self.open_line_idle_s = open_line_idle_s
        self._stopping = asyncio.Event()
        self.supervisor = Supervisor("worker")
        self.published = 0
        self.dropped = 0
        """Jobs given up because another worker owns them now."""
        self.optional_engines: frozenset[str] = frozenset()
        """Engines that may fail to load without failing the worker (``auto``'s ChatTTS)."""
        self.opus_bitrate = opus_bitrate if opus_bitrate > 0 and _has_pyav() else 0
        if opus_bitrate > 0 and not self.opus_bitrate:
            log.warning("PyAV is not installed: publishing PCM only (pip install 'voxroom[opus]')")
        # Lookups and stores on pipelines of their own: a lookup never waits behind a store's
        # 100 kB of PCM on the wire (bytes replies: the PCM is binary).
        self.cache = (AudioCache(store.commands(decode=False), store.commands(decode=False), slots=cache_slots,
                                 entry_max_bytes=cache_entry_max_bytes, ttl_s=cache_ttl_s,
                                 lru_entries=cache_lru_entries)
                      if cache_slots > 0 else None)
        for ctx in pool.contexts:
            ctx.cache = self.cache
        self.metrics = (MetricsServer(worker_registry(self), host=metrics_host, port=metrics_port)
                        if metrics_port > 0 else None)
        """This process's ``GET /metrics`` (workers/intake/metrics.py); ``None`` when turned off (port 0)."""
        self.metrics_port: int | None = None
        """The port ``/metrics`` listens on once started (in the heartbeat for scrape discovery)."""

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        # Metrics first and last: they answer while engines load (minutes for ChatTTS) and while
        # Redis is unreachable, which is when an operator looks.
        if self.metrics is not None:
            self.metrics_port = await self.metrics.start()
        try:
            await self._run()
        finally:
            if self.metrics is not None:
                await self.metrics.aclose()

    async def _start(self) -> None:
        await self._ensure_group_patiently()
        for ctx in self.pool.contexts:
            await ctx.load_engines(self.optional_engines)
        self.pool.engines_loaded()
        freeze_startup_objects()
        log.info("worker %s ready: %d contexts (%s), engines %s", self.id, len(self.pool.contexts),
                 ", ".join(c.device for c in self.pool.contexts), sorted(self.pool.engine_names()))

    async def _run(self) -> None:
        # A stop during start-up (waiting for Redis, loading engines) ends it at once
        # (workers/intake/stopping.py).
        started, _ = await unless_stopped(self._start(), self._stopping)
        if not started:
            log.info("worker %s stopped before it was ready", self.id)
            await self._close()
            return
        for ctx in self.pool.contexts:
            self.supervisor.spawn(f"context:{ctx.name}", functools.partial(ctx.run, self._on_started))
        self.supervisor.spawn("heartbeat", self._heartbeat)
        self.supervisor.spawn("keeper", self._keep_claimed)
        self.supervisor.spawn("turns", self.watcher.run)
        if self.cache is not None:
            self.supervisor.spawn("cache:stores", self.cache.run_stores)
        self.supervisor.spawn("intake", self._intake)
        try:
            await self._stopping.wait()
        finally:
            await self.supervisor.stop("intake")
            await self._drain()
            await self.supervisor.aclose()
            try:
                await self.bus.drop_heartbeat(self.id)
            except REDIS_DOWN:
                pass
            await self._close()
            log.info("worker %s stopped", self.id)

    async def _close(self) -> None:
        self.pool.close()
        if self.cache is not None:
            await self.cache.aclose()
        await self.bus.close()

    async def _ensure_group_patiently(self) -> None:
        backoff = Backoff()
        while True:
            try:
                await self.bus.ensure_group()
                return
            except REDIS_DOWN as exc:
                log.warning("worker %s: redis unavailable at start (%s); retrying in %.1f s", self.id, exc,
                            backoff.delay)
                await backoff.wait()

    async def _drain(self) -> None:
        if not self._publishers:
            return
        log.info("worker %s: waiting up to %.0f s for %d utterances in flight", self.id,
                 self.shutdown_timeout_s, len(self._publishers))
        _, pending = await asyncio.wait(set(self._publishers.values()), timeout=self.shutdown_timeout_s)
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

    async def _intake(self) -> None:
        """The one loop that takes jobs: a claim pass every half claim time, and in between
        blocked reads for as many jobs as fit. Only this loop submits to the pool, so what it
        computed as free is still free when the jobs arrive."""
        loop = asyncio.get_running_loop()
        backoff = Backoff(cap=RECONNECT_CAP_S)
        claim_every = self.claim_idle_ms / 2000.0
        next_claim = loop.time() + claim_every
        need_group = False
        while True:
            try:
                if need_group:
                    # Redis came back without our consumer group (it keeps no data): make it again.
                    await self.bus.ensure_group()
                    need_group = False
                if loop.time() >= next_claim:
                    next_claim = loop.time() + claim_every
                    await self._claim_stale()
                free = self.pool.free()
                if free == 0:
                    # Full: wait for room (a job leaving a queue), and claim no sooner than due.
                    self.pool.freed.clear()
                    if self.pool.free() == 0:
                        try:  # not wait_for: it can swallow the stop's cancel on 3.11 (gh-86296)
                            async with asyncio.timeout(max(0.0, next_claim - loop.time())):
                                await self.pool.freed.wait()
                        except TimeoutError:
                            pass
                    continue
                block_ms = max(1, min(READ_BLOCK_MS, int((next_claim - loop.time()) * 1000)))
                for job in await self.bus.read_jobs(count=free, block_ms=block_ms):
                    self._accept(job)
                backoff.reset()
            except REDIS_DOWN as exc:
                log.warning("worker %s: redis unavailable (%s); retrying in %.1f s", self.id, exc, backoff.delay)
                await backoff.wait()
            except ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                log.warning("worker %s: consumer group gone (redis restarted empty); recreating", self.id)
                need_group = True

    async def _claim_stale(self) -> None:
        # Claimed jobs may go past a full pool (workers/pool/context.py, "Adopted jobs"): lines of
        # other rooms holding every slot may be waiting for exactly these.
        room = self.pool.free() + self.pool.adoptable()
        if room == 0:
            return
        for job in await self.bus.claim_stale(self.claim_idle_ms, room):
            if job.entry_id in self.inflight:
                continue  # ours all along (our refresh was late): the take in progress goes on
            log.warning("worker %s claimed room %s utterance %d from a silent consumer", self.id, job.room, job.seq)
            self._accept(job, adopted=True)

    def _accept(self, job: Job, *, adopted: bool = False) -> None:
        """Hand ``job`` to a context (``adopted``: a claimed job, which may pass a full pool).
        Never raises: a job that no context can take stays pending in Redis (not in
        ``inflight``, so not refreshed) and is claimed after ``claim_idle_ms``."""
        utt = Utterance(job=job, slices=SliceBuffer(asyncio.get_running_loop()), read_ms=self.clock.now_ms())
        voice = self.catalog.get(job.voice) if job.voice in self.catalog else None
        if voice is None or not self.pool.serves(voice.engine):
            # Keep the room's order moving: publish an empty, failed utterance in its turn.
            utt.error = f"voice {job.voice!r} is not served by this worker"
            utt.slices.close()
            self.inflight[job.entry_id] = utt
            self._start_publisher(utt, None)
            return
        ctx = None
        if adopted and self.pool.has_lines_of(job.room):
            # Its room's later lines are here, queued or holding slots while they wait for its
            # turn: in the queue (a room's backlog has room for it) it could wait for a slot that
            # only its own end frees. Ahead, with a slot lent, it cannot.
            ctx = self.pool.adopt(utt, voice.engine)
        if ctx is None:
            ctx = self.pool.submit(utt, voice.engine)
        if ctx is None and adopted:
            ctx = self.pool.adopt(utt, voice.engine)
        if ctx is None:
            log.warning("worker %s: no context with room for engine %s; room %s utterance %d left for a claim",
                        self.id, voice.engine, job.room, job.seq)
            return
        self.inflight[job.entry_id] = utt
        self._owner[job.entry_id] = ctx

    def _on_started(self, utt: Utterance) -> None:
        ctx = self._owner.get(utt.job.entry_id)
        self._start_publisher(utt, ctx)
        if utt.job.open_seq:
            engine = ctx.engine_for(utt) if ctx is not None else None
            if ctx is None or engine is None:  # a context only starts lines it has the engine of
                utt.error = f"no engine here for voice {utt.job.voice!r}"
                utt.slices.close()
                return
            entry_id = utt.job.entry_id
            task = self._task(open_line.feed(self.bus, ctx, engine, utt, idle_s=self.open_line_idle_s,
                                             clock=self.clock), f"room:{utt.job.room}:utt:{utt.job.seq}:feed")
            self._feeds[entry_id] = task
            task.add_done_callback(lambda t: self._feeds.pop(entry_id, None) if
                                   self._feeds.get(entry_id) is t else None)

    def _start_publisher(self, utt: Utterance, ctx: Context | None) -> None:
        entry_id = utt.job.entry_id
        task = self._task(self._publish(utt, ctx), f"room:{utt.job.room}:utt:{utt.job.seq}")
        self._publishers[entry_id] = task
        task.add_done_callback(lambda t: self._publishers.pop(entry_id, None) if
                               self._publishers.get(entry_id) is t else None)

    async def _publish(self, utt: Utterance, ctx: Context | None) -> None:
        job = utt.job
        try:
            if utt.lost:
                return
            # Private API rooms (POST /v1/audio/speech): nobody plays them in real time, and the
            # gateway encodes the response itself, so neither pacing nor an Opus copy.
            private = job.room.startswith(keys.PRIVATE_ROOM_PREFIX)
            result = await publish_utterance(self.bus, utt, self.clock, lead_ms=self.lead_ms,
                                             order_wait_ms=self.order_wait_ms, voice_name=job.voice,
                                             opus_bitrate=0 if private else self.opus_bitrate, paced=not private)
            if result.status == "skipped":
                await self.bus.ack(job)  # finish acks the others, in the same script as their end
            if job.open_seq:
                await self.bus.drop_line(job)  # its pieces: the line is over (else the room TTL)
            self.published += 1
            stages = stage_seconds(utt, result.first_slice_ms)
            observe_utterance(self._engine_of(job.voice), utt, result, stages)
            _log_stages(utt, result, stages)
        except OwnershipLost:
            self._lost(utt)
        except REDIS_DOWN as exc:
            # Not acked and no longer refreshed: claimed again (by us or another worker) after
            # claim_idle_ms and restarted from its first slice.
            utt.cancel.set()
            log.warning("worker %s: redis unavailable while publishing room %s utterance %d (%s); left "
                        "for a claim", self.id, job.room, job.seq, exc)
        finally:
            feed = self._feeds.get(job.entry_id)
            if feed is not None:  # ended before its line did (cut, cancelled, lost): stop reading
                utt.cancel.set()
                feed.cancel()
                await asyncio.gather(feed, return_exceptions=True)
            self.inflight.pop(job.entry_id, None)
            self._owner.pop(job.entry_id, None)
            if ctx is not None:
                ctx.release(utt)

    def _engine_of(self, voice_id: str) -> str:
        voice = self.catalog.get(voice_id) if voice_id in self.catalog else None
        return voice.engine if voice is not None else "none"

    def _lost(self, utt: Utterance) -> None:
        """Another worker owns ``utt``'s job now: stop its synthesis, write nothing more."""
        if utt.lost:
            return
        utt.lost = True
        utt.cancel.set()
        self.dropped += 1
        log.warning("worker %s: room %s utterance %d is another worker's now; dropped", self.id, utt.job.room,
                    utt.job.seq)

    # -- upkeep ----------------------------------------------------------------------------------

    async def _heartbeat(self) -> None:
        while True:
            try:
                await self.bus.heartbeat(self.id, self._health(), HEARTBEAT_TTL_S, int(time.time() * 1000))
            except REDIS_DOWN as exc:
                log.warning("worker %s: heartbeat not written: %s", self.id, exc)
            await asyncio.sleep(HEARTBEAT_S)

    def _health(self) -> dict[str, Any]:
        return {
            "engines": ",".join(sorted(self.pool.engine_names())),
            "voices": ",".join(sorted(v.id for v in self.catalog if v.engine in self.pool.engine_names())),
            "contexts": ",".join(c.device for c in self.pool.contexts),
            "load": self.pool.load(), "free": self.pool.free(), "published": self.published,
            "dropped": self.dropped, "rtf": f"{_rtf(self.pool):.3f}", "pid": os.getpid(),
            "time_ms": int(time.time() * 1000),
            "loops_down": ",".join(self.supervisor.down()), "loop_restarts": self.supervisor.restarts(),
            **context_fields(self.pool.contexts),
            **(self.cache.stats.fields() if self.cache is not None else {}),
            **({"metrics_port": self.metrics_port} if self.metrics_port is not None else {}),
        }

    async def _keep_claimed(self) -> None:
        while True:
            await asyncio.sleep(self.claim_idle_ms / 3000.0)
            try:
                lost = await self.bus.touch(list(self.inflight))
            except REDIS_DOWN as exc:
                log.warning("worker %s: could not refresh claims: %s", self.id, exc)
                continue
            for entry_id in lost:
                utt = self.inflight.get(entry_id)
                if utt is None:
                    continue  # finished (and acked) meanwhile
                self._lost(utt)
                publisher = self._publishers.get(entry_id)
                if publisher is not None:
                    publisher.cancel()  # its finally gives the context slot back


def _log_stages(utt: Utterance, result: PublishResult, stages: dict[str, float | None]) -> None:
    """One line per utterance with where its time to first audio went (the same figures as the
    ``voxroom_worker_first_audio_stage_seconds`` histograms, workers/intake/metrics.py): the gateway's
    accept to this worker's read, the read to the engine's call (context queue, cache lookup,
    hand-off), the engine's own first chunk, and the first chunk to the first slice published."""
    job = utt.job

    def ms(stage: str) -> str:
        value = stages[stage]
        return f"{value * 1000.0:.1f}" if value is not None else "-"

    log.info("room %s utterance %d %s: %d slices, time to first audio %s ms (read %s, to engine %s, engine "
             "first chunk %s, to published %s), %d late shifts", job.room, job.seq, result.status, result.chunks,
             ms("total"), ms("read"), ms("to_engine"), ms("engine_first_chunk"), ms("to_published"),
             result.late_shifts)


def _rtf(pool: ContextPool) -> float:
    audio = sum(c.audio_seconds for c in pool.contexts)
    return sum(c.synth_seconds for c in pool.contexts) / audio if audio else 0.0


def _has_pyav() -> bool:
    import importlib.util

    return importlib.util.find_spec("av") is not None
