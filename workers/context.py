"""A synthesis context: one device, one thread, its own engine instances, a bounded queue.

The pool makes one context per GPU (``cuda:N``) and a configurable number of CPU contexts where
there is none. Everything an engine does runs on the context's own thread, so engines need no
locks of their own and blocking inference never touches the event loop.

Bounds (and what happens past them):

- ``queue_size``: jobs accepted but not started, one per room (each room's next line);
  ``backlog``: the later lines of those rooms, held behind them. The queue takes rooms in turn,
  the one that runs out of audio soonest first (``workers/jobqueue.py``). The worker reads from
  Redis only while the pool has room, so past these bounds jobs simply stay in Redis for another
  worker (back-pressure).
- ``inflight``: jobs between start of synthesis and end of publishing. A finished synthesis whose
  room is still busy playing a predecessor keeps its slot until it is published.
- Adopted jobs (claimed from a dead worker, :meth:`Context.adopt`) go ahead of the queue and may
  pass both bounds, by at most ``inflight`` at a time. They are the lines other rooms' lines wait
  for: when the slots are all held by lines waiting for their turn, and their predecessors can
  only be adopted into this same pool, refusing them would hold every one of those rooms until
  ``order_wait_ms`` skips past the lost line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeGuard

import numpy as np

from voxroom.errors import EngineError
from voxroom.protocol import SLICE_MS
from voxroom.voices import Catalog
from workers.cache import AudioCache, fingerprint, to_slices
from workers.engines.base import BatchEngine, ContinuousEngine, Engine, SynthesisRequest
from workers.job import MAX_UTTERANCE_SLICES, Utterance
from workers.jobqueue import JobQueue
from workers.slicer import Slice, Slicer

log = logging.getLogger("voxroom.worker.context")


class Context:
    def __init__(self, name: str, device: str, engines: dict[str, Engine], catalog: Catalog, *,
                 queue_size: int = 4, inflight: int = 64, batch_window_ms: float = 15.0,
                 max_slices: int = MAX_UTTERANCE_SLICES, backlog: int = 64, fair: bool = True) -> None:
        self.name = name
        self.device = device
        self.engines = engines
        self.catalog = catalog
        self.queue = JobQueue(queue_size, backlog, fair=fair)
        self.inflight = inflight
        self.active = 0
        """Jobs taken off the queue and not yet published."""
        self.playing: dict[str, list[Utterance]] = {}
        """Those same jobs by room: their slices not yet published are the room's buffered audio
        (what the queue schedules by, see ``ContextPool.buffered_ms``)."""
        self.adopted = 0
        """Adopted jobs held past the bounds (see the module docstring), at most ``inflight``."""
        self.batch_window_s = batch_window_ms / 1000.0
        self.max_slices = min(max_slices, MAX_UTTERANCE_SLICES)
        """One utterance's audio is cut here: 500 characters of symbols would otherwise make
        minutes of audio and hold this context (and the room) for all of it."""
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"vx-{name}")
        self._slots = asyncio.Semaphore(inflight)
        self.synth_seconds = 0.0
        self.audio_seconds = 0.0
        self._continuous: dict[str, tuple[queue.SimpleQueue[Utterance | None], threading.Thread]] = {}
        """Continuous engines' inboxes and serving threads, by engine name. A thread removes its
        own entry (under ``_continuous_lock``) before it fails what is left in its inbox, and
        ``_admit`` puts under the same lock: a line is either in a live thread's inbox or in the
        drain of a dying one, never in the inbox of a thread that is gone."""
        self._continuous_lock = threading.Lock()
        self._admitting: set[asyncio.Task[None]] = set()
        """Jobs for a continuous engine between the queue and the engine (at most ``inflight``)."""
        self.cache: AudioCache | None = None
        """Set by the worker; a hit is published without touching the engine (workers/cache.py)."""
        self.on_free: Callable[[], None] = _nothing
        """Called when room opens here (a job left the queue, or finished publishing); the pool
        sets it to wake the worker's intake."""

    @property
    def load(self) -> int:
        return self.queue.qsize() + self.active

    @property
    def capacity(self) -> int:
        return self.queue.maxsize + self.queue.backlog + self.inflight

    def free(self) -> int:
        return max(0, self.capacity - self.load)

    async def load_engines(self, optional: frozenset[str] = frozenset()) -> None:
        """Load every engine on this context's thread. An engine named in ``optional`` that fails
        to load (``auto`` found ChatTTS weights that turn out corrupt) is dropped with one clear
        log line instead of failing the worker; any other failure raises ``EngineError``."""
        loop = asyncio.get_running_loop()
        for name, engine in list(self.engines.items()):
            try:
                await loop.run_in_executor(self._executor, engine.load, self.device)
            except EngineError as exc:
                if name not in optional:
                    raise
                log.error("context %s: engine %s could not load (%s); serving the other voices", self.name,
                          name, exc)
                del self.engines[name]
        if not self.engines:
            raise EngineError(f"context {self.name}: no engine could load")

    async def run(self, on_started: Callable[[Utterance], None]) -> None:
        """Take jobs off the queue forever; ``on_started`` hands each one to its publisher."""
        loop = asyncio.get_running_loop()
        while True:
            # The slot first, then the job: a job is either queued or active, never held in
            # between, so ``free()`` (what the worker reads from Redis by) is exact.
            await self._slots.acquire()
            try:
                first = await self.queue.get()
            except BaseException:
                self._slots.release()
                raise
            self._taken(first)
            engine = self._engine_for(first)
            if _continuous(engine):
                # One runner takes every room a GPU serves: each job's cache lookup and hand-off
                # run beside the next jobs' instead of one after the other (100 lookups in a row
                # were 8 ms before the last room's engine started).
                task = asyncio.create_task(self._start_continuous(engine, first, on_started),
                                           name=f"{self.name}:admit:{first.job.room}")
                self._admitting.add(task)
                task.add_done_callback(self._admitting.discard)
                continue
            if await self._serve_cached(first, on_started):
                continue
            batch = [first]
            if _batches(engine):
                batch += [u for u in await self._gather_batch(engine, first)
                          if not await self._serve_cached(u, on_started)]
            for utt in batch:
                on_started(utt)
            future = loop.run_in_executor(self._executor, self._synthesize, engine, batch)
            # Synthesis of the next job may start as soon as this one's engine work is done; the
            # slot is given back when publishing ends (see ``release``).
            await asyncio.wait([future])
            exc = future.exception()
            if exc is not None:  # _synthesize catches engine errors; this is a bug, keep serving
                log.error("context %s synthesis crashed", self.name, exc_info=exc)
            elif self.cache is not None:
                self._store(engine, batch, future.result())

    # -- continuous engines ----------------------------------------------------------------------

    async def _start_continuous(self, engine: ContinuousEngine, utt: Utterance,
                                on_started: Callable[[Utterance], None]) -> None:
        """Start the line in the engine at once and look it up in the audio cache meanwhile. A
        miss (the usual case) then costs no round trip before the engine starts (100 rooms in a
        burst: 13.9 ms median added latency vs 15.0 with the lookup in front, two alternating
        runs each); a hit claims the line before the engine's first chunk (a lookup takes a
        fraction of a millisecond, a first chunk tens) and stops the engine's row."""
        on_started(utt)
        self._admit(engine, utt)
        if self.cache is None:
            return
        pcm = await self._lookup(engine, utt)
        if pcm is None or not utt.claim("cache"):
            return  # a miss, or the engine's audio already began: that plays, whole
        utt.cancel.set()  # the engine drops the row at its next step (see _finish_row)
        self._serve_pcm(utt, pcm)

    def _admit(self, engine: ContinuousEngine, utt: Utterance) -> None:
        """Hand ``utt`` to the engine's serving thread (started on first use): it joins the
        running batch at the engine's next step. No await: the runner takes the next job at once."""
        with self._continuous_lock:
            served = self._continuous.get(engine.name)
            if served is None:
                inbox: queue.SimpleQueue[Utterance | None] = queue.SimpleQueue()
                thread = threading.Thread(target=self._serve_continuous,
                                          args=(engine, inbox, asyncio.get_running_loop()),
                                          name=f"vx-{self.name}-{engine.name}", daemon=True)
                served = (inbox, thread)
                self._continuous[engine.name] = served
                thread.start()
            served[0].put(utt)
        # Let the engine's thread take the GIL now (sleep releases it): it starts this row's clock
        # at once instead of when the loop next blocks, after every other line of the burst. The
        # rows' first chunks then come as spread out as their lines arrived, and the loop
        # publishes each while the next is computed, instead of 100 in one clump (a burst of 100
        # rooms: 16 ms median added latency instead of 19, three alternating runs each).
        time.sleep(0)

    def _serve_continuous(self, engine: ContinuousEngine, inbox: queue.SimpleQueue[Utterance | None],
                          loop: asyncio.AbstractEventLoop) -> None:
        """The engine's thread for as long as the context lives: one call to
        ``stream_continuous``, rows coming in through ``inbox``, each row sliced as it would be in
        :meth:`_synthesize`. (Its synthesis time is not added to the context's RTF figure: rows
        overlap, so per-row wall time would overstate it.)"""
        rows: dict[Hashable, tuple[Utterance, Slicer, list[Slice] | None, float]] = {}

        def admit(timeout: float | None) -> list[tuple[Hashable, SynthesisRequest, threading.Event]] | None:
            taken: list[Utterance | None] = []
            try:
                taken.append(inbox.get(timeout=timeout) if timeout != 0 else inbox.get_nowait())
                while True:
                    taken.append(inbox.get_nowait())
            except queue.Empty:
                pass
            admitted: list[tuple[Hashable, SynthesisRequest, threading.Event]] = []
            for utt in taken:
                if utt is None:
                    return None
                utt.synth_started_ms = time.time() * 1000.0
                key = utt.job.entry_id
                rows[key] = (utt, Slicer(engine.sample_rate), [] if self.cache is not None else None,
                             time.perf_counter())
                admitted.append((key, self._request(utt), utt.cancel))
            return admitted

        try:
            for key, pcm in engine.stream_continuous(admit):
                row = rows.get(key)
                if row is None:
                    continue
                utt, slicer, kept, started = row
                if pcm is not None:
                    self._feed(utt, slicer, pcm, started, kept)
                    continue
                del rows[key]
                self._finish_row(engine, utt, slicer, kept, loop)
        except Exception as exc:  # the engine failed: its rows fail, the next job starts it again
            log.exception("context %s: engine %s failed", self.name, engine.name)
            reason = f"{type(exc).__name__}: {exc}"
            for utt, slicer, kept, _started in rows.values():
                if utt.claim("engine"):  # a line the cache serves is not failed by the engine
                    utt.error = reason
                self._finish_row(engine, utt, slicer, kept, loop)
        else:
            reason = "context closed"
        finally:
            # Lines handed over but never admitted (the engine failed before asking for them, or
            # the context closed) end too: this thread is gone, and the next job starts a new one
            # with a new inbox. Unregistering first, under the lock ``_admit`` puts under, means
            # no line can land in this inbox after the drain below.
            with self._continuous_lock:
                if self._continuous.get(engine.name, (None, None))[0] is inbox:
                    del self._continuous[engine.name]
            while True:
                try:
                    waiting = inbox.get_nowait()
                except queue.Empty:
                    break
                if waiting is not None and waiting.claim("engine"):
                    waiting.error = reason
                    waiting.slices.close()

    def _finish_row(self, engine: Engine, utt: Utterance, slicer: Slicer, kept: list[Slice] | None,
                    loop: asyncio.AbstractEventLoop) -> None:
        if not utt.claim("engine"):
            return  # the audio cache served this line; its slices are closed already
        if not utt.cancel.is_set() and utt.error is None:
            tail = slicer.flush()
            utt.slices.extend(tail)
            if kept is not None:
                kept += tail
        utt.slices.close()
        self.audio_seconds += slicer.total_samples / slicer.out_rate
        if kept is not None and self.cache is not None:
            pcm = b"".join(piece.tobytes() for piece in kept)
            with contextlib.suppress(RuntimeError):  # the loop closed: the worker is gone
                loop.call_soon_threadsafe(self._store, engine, [utt], [pcm])

    def _fingerprint(self, engine: Engine, utt: Utterance) -> str:
        request = self._request(utt)
        return fingerprint(engine=engine.name, model_version=str(getattr(engine, "model_version", "")),
                           engine_rate=engine.sample_rate, voice=request.voice, text=request.text,
                           previous_voice=request.previous_voice)

    async def _serve_cached(self, utt: Utterance, on_started: Callable[[Utterance], None]) -> bool:
        """Publish ``utt`` from the audio cache when it is there (its slot is taken and released by
        the publisher as for fresh audio). ``False``: a miss, synthesize it."""
        if self.cache is None:
            return False
        pcm = await self._lookup(self._engine_for(utt), utt)
        if pcm is None:
            return False
        on_started(utt)
        utt.claim("cache")  # nothing else started it: always granted
        self._serve_pcm(utt, pcm)
        return True

    async def _lookup(self, engine: Engine, utt: Utterance) -> bytes | None:
        assert self.cache is not None
        try:
            return await self.cache.get(self._fingerprint(engine, utt))
        except Exception:  # a cache bug must cost a synthesis, never the context's runner
            log.exception("context %s: audio cache lookup failed; synthesizing", self.name)
            return None

    @staticmethod
    def _serve_pcm(utt: Utterance, pcm: bytes) -> None:
        utt.engine_first_chunk_ms = 0.0
        utt.slices.extend(to_slices(pcm))
        utt.slices.close()

    def _store(self, engine: Engine, batch: Sequence[Utterance], pcms: list[bytes]) -> None:
        assert self.cache is not None
        for utt, pcm in zip(batch, pcms, strict=True):
            # A failed, cancelled or cut-short utterance is not the line's audio: never cache it.
            if utt.error is None and not utt.cancel.is_set() and pcm:
                self.cache.store_later(self._fingerprint(engine, utt), pcm)

    async def _gather_batch(self, engine: Engine, first: Utterance) -> list[Utterance]:
        """More jobs for the same engine that arrive within the batch window, as many as there
        are free slots: never a wait on a slot. Slots come back only when publishing ends, and
        publishing cannot start before this batch is synthesized: with ``inflight`` below the
        engine's batch, waiting here for a slot hung the context for good."""
        more: list[Utterance] = []
        deadline = time.monotonic() + self.batch_window_s
        while len(more) + 1 < engine.max_batch and not self._slots.locked():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                utt = await asyncio.wait_for(self.queue.get(), remaining)
            except TimeoutError:
                break
            if self._engine_for(utt) is not engine:
                self.queue.put_back(utt)
                break
            await self._slots.acquire()  # never waits: not locked, and only this runner acquires
            self._taken(utt)
            more.append(utt)
        return more

    def adopt(self, utt: Utterance) -> bool:
        """Take a job claimed from a dead worker ahead of the queue, with a slot of its own lent
        past the ``inflight`` bound (given back, not returned to the pool, by :meth:`release`).
        ``False`` when ``inflight`` adopted jobs are already held here."""
        if self.adopted >= self.inflight:
            return False
        self.adopted += 1
        utt.adopted = True
        self.queue.put_first(utt)
        self._slots.release()  # the lent slot: the runner may take it at once, whatever it waits on
        return True

    def _taken(self, utt: Utterance) -> None:
        self.active += 1
        self.playing.setdefault(utt.job.room, []).append(utt)
        self.on_free()

    def buffered_ms(self, room: str) -> float:
        """Audio of ``room`` this context made and has not published yet (a line in synthesis
        counts what it has so far). Paced publishing takes a slice ``lead_ms`` before it plays, so
        this is about how long the room's audio lasts beyond the lead."""
        utts = self.playing.get(room)
        return sum(u.slices.pending() for u in utts) * SLICE_MS if utts else 0.0

    def release(self, utt: Utterance) -> None:
        """A job of this context finished publishing."""
        utts = self.playing.get(utt.job.room, [])
        for i, held in enumerate(utts):
            if held is utt:  # by identity: dataclass equality would compare every field
                del utts[i]
                if not utts:
                    del self.playing[utt.job.room]
                break
        self.active -= 1
        if utt.adopted:
            self.adopted -= 1  # its lent slot ends with it
        else:
            self._slots.release()
        self.on_free()

    def _engine_for(self, utt: Utterance) -> Engine:
        voice = self.catalog.get(utt.job.voice)
        return self.engines[voice.engine]

    def _request(self, utt: Utterance) -> SynthesisRequest:
        voice = self.catalog.get(utt.job.voice)
        prev = self.catalog.get(utt.job.prev_voice) if utt.job.prev_voice in self.catalog else None
        return SynthesisRequest(text=utt.job.text, voice=voice, request_id=f"{utt.job.room}/{utt.job.seq}",
                                previous_voice=prev)

    # -- on the context thread -------------------------------------------------------------------

    def _synthesize(self, engine: Engine, batch: Sequence[Utterance]) -> list[bytes]:
        """Returns every utterance's PCM when the cache wants it (joined here, off the loop)."""
        started = time.perf_counter()
        for utt in batch:
            utt.synth_started_ms = time.time() * 1000.0
        slicers = [Slicer(engine.sample_rate) for _ in batch]
        kept: list[list[Slice]] = [[] for _ in batch]
        tee = kept if self.cache is not None else None
        try:
            if len(batch) > 1 and _batches(engine):
                chunks = engine.stream_batch([self._request(u) for u in batch], [u.cancel for u in batch])
                for row, pcm in chunks:
                    self._feed(batch[row], slicers[row], pcm, started, tee[row] if tee else None)
            else:
                for pcm in engine.stream(self._request(batch[0]), batch[0].cancel):
                    self._feed(batch[0], slicers[0], pcm, started, tee[0] if tee else None)
        except Exception as exc:  # an engine failure fails its utterances, never the context
            log.exception("context %s: engine %s failed", self.name, engine.name)
            for utt in batch:
                utt.error = f"{type(exc).__name__}: {exc}"
        finally:
            for utt, slicer, mine in zip(batch, slicers, kept, strict=True):
                if not utt.cancel.is_set():
                    tail = slicer.flush()
                    utt.slices.extend(tail)
                    mine += tail
                utt.slices.close()
                self.audio_seconds += slicer.total_samples / slicer.out_rate
            self.synth_seconds += time.perf_counter() - started
        return [b"".join(s.tobytes() for s in mine) if tee is not None else b"" for mine in kept]

    def _feed(self, utt: Utterance, slicer: Slicer, pcm: object, started: float,
              tee: list[Slice] | None = None) -> None:
        if utt.cancel.is_set():
            return
        if utt.source != "engine" and not utt.claim("engine"):
            return  # the audio cache serves this line (the row is being cancelled)
        if utt.engine_first_chunk_ms is None:
            utt.engine_first_chunk_ms = (time.perf_counter() - started) * 1000.0
        pieces = slicer.push(pcm)  # type: ignore[arg-type]
        room_left = self.max_slices - 1 - utt.slices.produced
        if len(pieces) > room_left:
            # Too long (a runaway engine or a hostile line): end here, faded so the cut does not
            # click, and stop the engine.
            pieces = pieces[:max(0, room_left) + 1]
            fade = np.linspace(1.0, 0.0, pieces[-1].size, dtype=np.float32)
            pieces[-1] = (pieces[-1].astype(np.float32) * fade).astype(np.int16)
            utt.slices.extend(pieces)
            utt.cancel.set()
            log.warning("room %s utterance %d cut at %d slices", utt.job.room, utt.job.seq, self.max_slices)
            return
        # One hand-over per engine chunk, not per slice (see SliceBuffer).
        utt.slices.extend(pieces)
        if tee is not None:
            tee += pieces

    def close(self) -> None:
        with self._continuous_lock:
            for inbox, _thread in self._continuous.values():
                inbox.put(None)
        for engine in self.engines.values():
            try:
                engine.close()
            except Exception:
                log.exception("closing engine %s", engine.name)
        self._executor.shutdown(wait=False, cancel_futures=True)


def _nothing() -> None:
    pass


def _batches(engine: Engine) -> TypeGuard[BatchEngine]:
    """A batch engine with room for more than one row. Not ``isinstance(engine, BatchEngine)``
    per job: a runtime-checked Protocol inspects the class on every call (about 10 µs)."""
    return getattr(engine, "max_batch", 1) > 1 and callable(getattr(engine, "stream_batch", None))


def _continuous(engine: Engine) -> TypeGuard[ContinuousEngine]:
    """An engine that takes rows while it runs (``continuous`` set and ``max_batch`` > 1)."""
    return bool(getattr(engine, "continuous", False)) and _batches(engine)
