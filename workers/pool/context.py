"""A synthesis context: one device, one thread, its own engine instances, a bounded queue.

The pool makes one context per GPU (``cuda:N``) and a configurable number of CPU contexts where
there is none. Everything an engine does runs on the context's own thread, so engines need no
locks of their own and blocking inference never touches the event loop.

Bounds (and what happens past them):

- ``queue_size``: jobs accepted but not started, one per room (each room's next line);
  ``backlog``: the later lines of those rooms, held behind them. The queue takes rooms in turn,
  the one that runs out of audio soonest first (``workers/pool/line_queue.py``). The worker reads from
  Redis only while the pool has room, so past these bounds jobs simply stay in Redis for another
  worker (back-pressure).
- ``inflight``: jobs between start of synthesis and end of publishing. A finished synthesis whose
  room is still busy playing a predecessor keeps its slot until it is published.
- A continuous engine's places (``workers/pool/continuous_rows.py``): it is handed at most ``max_batch`` plus
  ``SPARE_ROWS`` lines not yet finished; the rest wait in the queue, which picks the line that
  takes a freed place (a row's end: EOS, cancel, the length cut, a failure). Lines for other
  engines pass a full one.
- Adopted jobs (claimed from a dead worker, :meth:`Context.adopt`) go ahead of the queue and may
  pass both bounds, by at most ``inflight`` at a time. They are the lines other rooms' lines wait
  for: when the slots are all held by lines waiting for their turn, and their predecessors can
  only be adopted into this same pool, refusing them would hold every one of those rooms until
  ``order_wait_ms`` of silence in the room skips past the lost line.

A context owns its slots, its queue and what it is playing; the work is done by one module per
job: ``workers/pool/batching.py`` (windowed batches), ``workers/pool/continuous_rows.py`` (continuous engines' serving
threads), ``workers/pool/cache_race.py`` (the audio cache, and its race with a continuous engine) and
``workers/pool/row_audio.py`` (a row's slices, the length cut, its end and the audio it counts).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from voxroom.errors import EngineError
from voxroom.voices.catalog import Catalog
from voxroom.wire.protocol import SLICE_MS
from workers.audio_cache.cache import AudioCache, CachedLine
from workers.engines.base import ContinuousEngine, Engine, SynthesisRequest
from workers.pool import batching
from workers.pool.cache_race import CachedAudio, fingerprint_of
from workers.pool.continuous_rows import ContinuousRows, continuous
from workers.pool.line_queue import JobQueue
from workers.utterance import MAX_UTTERANCE_SLICES, SliceBuffer, Utterance, switch_of

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
        """The RTF figures (``workers/pool/row_audio.py``, ``Meter``): this context is their meter."""
        self._cached = CachedAudio(name, self._fingerprint)
        self._rows = ContinuousRows(name, self._request, self._cached, self, max_slices=self.max_slices,
                                    on_place=self.queue.wake)
        self._racing: set[asyncio.Task[None]] = set()
        """Cache lookups beside lines a continuous engine already started (at most ``inflight``)."""
        self.on_free: Callable[[], None] = _nothing
        """Called when room opens here (a job left the queue, or finished publishing); the pool
        sets it to wake the worker's intake."""

    @property
    def cache(self) -> AudioCache | None:
        """Set by the worker; a hit is published without touching the engine (workers/pool/cache_race.py)."""
        return self._cached.cache

    @cache.setter
    def cache(self, cache: AudioCache | None) -> None:
        self._cached.cache = cache

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
        # Only a context with a continuous engine has lines to pass over (a full engine's).
        accept = self._has_place if any(continuous(e) for e in self.engines.values()) else None
        while True:
            # The slot first, then the job: a job is either queued or active, never held in
            # between, so ``free()`` (what the worker reads from Redis by) is exact.
            await self._slots.acquire()
            try:
                first = await self.queue.get(accept)
            except BaseException:
                self._slots.release()
                raise
            self._taken(first)
            engine = self._engine_for(first)
            if engine is None:
                self._unserved(first, on_started)
                continue
            if first.job.open_seq:
                # An open line: its feed (workers/pool/open_line.py) hands its clauses to
                # :meth:`speak_clause` as they come; nothing of it runs here, and the cache has none.
                first.claim("engine")
                on_started(first)
                continue
            if continuous(engine):
                self._start_continuous(engine, first, on_started)
                continue
            if await self._cached.serve(engine, first, on_started):
                continue
            batch = [first]
            if batching.batches(engine):
                more = await batching.gather(engine, self.queue, self._slots, self.batch_window_s,
                                             self._engine_for, self._taken)
                batch += [u for u in more if not await self._cached.serve(engine, u, on_started)]
            for utt in batch:
                on_started(utt)
            future = loop.run_in_executor(self._executor, self._synthesize, engine, batch)
            # Synthesis of the next job may start as soon as this one's engine work is done; the
            # slot is given back when publishing ends (see ``release``).
            await asyncio.wait([future])
            exc = future.exception()
            if exc is not None:  # synthesize catches engine errors; this is a bug, keep serving
                log.error("context %s synthesis crashed", self.name, exc_info=exc)
                continue
            for utt, pcm in zip(batch, future.result(), strict=True):
                self._cached.store(engine, utt, pcm)

    def _synthesize(self, engine: Engine, batch: list[Utterance]) -> list[CachedLine | None]:
        """On the context thread."""
        return batching.synthesize(self.name, engine, batch, self._request, keep=self.cache is not None,
                                   max_slices=self.max_slices, meter=self)

    def _start_continuous(self, engine: ContinuousEngine, utt: Utterance,
                          on_started: Callable[[Utterance], None]) -> None:
        """Start the line in the engine at once (the queue gave it only because the engine has a
        place: :meth:`_has_place`) and look it up in the audio cache meanwhile
        (``CachedAudio.race``). The hand-off is synchronous, so the next ``_has_place`` counts
        this line; the lookups run as tasks, each beside the next jobs' instead of one after
        the other (100 lookups in a row were 8 ms before the last room's engine started)."""
        on_started(utt)
        self._rows.admit(engine, utt)
        if self.cache is None:
            return
        task = asyncio.create_task(self._cached.race(engine, utt), name=f"{self.name}:race:{utt.job.room}")
        self._racing.add(task)
        task.add_done_callback(self._racing.discard)

    async def speak_clause(self, engine: Engine, line: Utterance, text: str, offset: int) -> None:
        """One clause of the open line ``line`` (``text``, at ``offset`` in the line's text),
        synthesized like a line of its own (its own slicer, fades and padding: the line's audio is
        its clauses said alone, joined) and appended to the line's slices; its word marks moved to
        where it starts, in time and in the text. On this context's thread for a windowed engine,
        as a row of a continuous one; the line's ``cancel`` stops it, as a line's. Past the
        context's length cut the line is cut (its ``cancel`` set)."""
        before = line.slices.produced
        room_left = self.max_slices - before
        if room_left <= 0:
            line.cancel.set()
            return
        loop = asyncio.get_running_loop()
        clause = Utterance(job=replace(line.job, text=text, open_seq=0), slices=SliceBuffer(loop),
                           cancel=line.cancel, read_ms=line.read_ms)
        clause.claim("engine")
        synthesis: asyncio.Future[list[CachedLine | None]] | None = None
        if continuous(engine):
            self._rows.admit(engine, clause)
        else:
            synthesis = loop.run_in_executor(self._executor, functools.partial(
                batching.synthesize, self.name, engine, [clause], self._request, keep=False, max_slices=room_left,
                meter=self))
        try:
            shift_ms = before * SLICE_MS
            while (item := await clause.slices.get()) is not None:
                marks = clause.slices.take_marks()
                if marks:
                    line.slices.add_marks([m.shifted(shift_ms, offset) for m in marks])
                line.slices.put(item)
                if line.slices.produced >= self.max_slices:
                    line.cancel.set()  # the length cut: a continuous row's own counts its clause only
            marks = clause.slices.take_marks()
            if marks:
                line.slices.add_marks([m.shifted(shift_ms, offset) for m in marks])
        finally:
            if synthesis is not None:
                await asyncio.wait([synthesis])
        if line.synth_started_ms is None:
            line.synth_started_ms = clause.synth_started_ms
            line.engine_first_chunk_ms = clause.engine_first_chunk_ms
        if clause.error is not None:
            line.error = clause.error

    def engine_for(self, utt: Utterance) -> Engine | None:
        """The engine of this context that speaks ``utt``'s voice (``None``: none here)."""
        return self._engine_for(utt)

    def _has_place(self, utt: Utterance) -> bool:
        """The queue's ``accept``: a line may be taken unless its engine is a continuous one
        with no free place (``workers/pool/continuous_rows.py``, ``SPARE_ROWS``)."""
        engine = self._engine_for(utt)
        return engine is None or not continuous(engine) or self._rows.has_place(engine)

    def _unserved(self, utt: Utterance, on_started: Callable[[Utterance], None]) -> None:
        """A job for an engine this context does not hold (the pool submits only to contexts
        holding it, so this is a caller's bug, or an engine dropped since): it ends failed, in
        its turn, and the runner goes on."""
        voice = self.catalog.get(utt.job.voice) if utt.job.voice in self.catalog else None
        what = f"voice {utt.job.voice!r}" if voice is None else f"engine {voice.engine!r}"
        log.error("context %s: no %s for room %s utterance %d; failing it", self.name, what, utt.job.room,
                  utt.job.seq)
        on_started(utt)
        utt.claim("engine")
        utt.error = f"{what} is not served by context {self.name}"
        utt.slices.close()

    def _fingerprint(self, engine: Engine, utt: Utterance) -> str:
        return fingerprint_of(engine, self._request(utt))

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

    def _engine_for(self, utt: Utterance) -> Engine | None:
        voice = self.catalog.get(utt.job.voice) if utt.job.voice in self.catalog else None
        return None if voice is None else self.engines.get(voice.engine)

    def _request(self, utt: Utterance) -> SynthesisRequest:
        """The one place a line's ``SynthesisRequest`` is built (synthesis and cache keys alike)."""
        voice = self.catalog.get(utt.job.voice)
        switch = switch_of(utt.job, self.catalog)
        return SynthesisRequest(text=utt.job.text, voice=voice, request_id=f"{utt.job.room}/{utt.job.seq}",
                                previous_voice=switch.previous_voice, switch_range=switch.switch_range,
                                lexicon=tuple(sorted(utt.job.lexicon.items())))

    def close(self) -> None:
        self._rows.close()
        for engine in self.engines.values():
            try:
                engine.close()
            except Exception:
                log.exception("closing engine %s", engine.name)
        self._executor.shutdown(wait=False, cancel_futures=True)


def _nothing() -> None:
    pass
