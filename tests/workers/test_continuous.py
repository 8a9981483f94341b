"""A continuous-batching engine in a context: rows join the running batch at any moment, each
starts ``ttfc`` after its own arrival (no batch window), one thread serves them all, and a
cancelled row stops alone; a line in the audio cache is taken from the engine that already
started it, unless the engine's audio began first. The engine is the synthetic benchmark engine (it sleeps instead of
computing), driven by the real context code with real threads."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import uuid
from collections.abc import Hashable, Iterator

import numpy as np
import pytest
from redis.asyncio import Redis

from tests.support.stores import Stores
from voxroom.voices.catalog import Catalog
from voxroom.wire.jobs import Job
from voxroom.wire.protocol import ROOM_RATE, SLICE_SAMPLES
from workers.audio_cache.cache import AudioCache, CachedLine
from workers.engines.base import Admit, Pcm, SynthesisRequest
from workers.engines.synthetic import SyntheticEngine
from workers.launch import worker_catalog
from workers.pool.context import Context
from workers.utterance import SliceBuffer, Utterance

# The machine's own timing is what these measure (a row starts on its own clock, a tick wakes its
# sleepers together): run alone (scripts/test), not beside tests that keep the cores busy.
pytestmark = pytest.mark.serial

TTFC_MS = 60.0


def _utterance(seq: int, text: str) -> Utterance:
    job = Job(entry_id=f"{seq}-0", room=f"cont-{seq}", seq=seq, text=text, voice="en-espeak",
              prev_voice="en-espeak", sender="t", time_ms=time.time() * 1000)
    return Utterance(job=job, slices=SliceBuffer(asyncio.get_running_loop()))


async def _drain(utt: Utterance, arrived: float) -> tuple[float, np.ndarray]:
    """(ms from ``arrived`` to the first slice, the utterance's audio)."""
    first = await utt.slices.get()
    assert first is not None
    first_ms = (time.perf_counter() - arrived) * 1000
    slices = [first]
    while (piece := await utt.slices.get()) is not None:
        slices.append(piece)
    return first_ms, np.concatenate(slices)


async def test_rows_join_a_running_batch_and_each_starts_on_its_own_clock() -> None:
    engine = SyntheticEngine(ttfc_ms=TTFC_MS, rtf=0.05, max_batch=16, continuous=True)
    catalog = worker_catalog(Catalog.load(), {"synthetic"})
    ctx = Context("cpu#0", "cpu", {"synthetic": engine}, catalog, queue_size=8, inflight=16)
    started: list[Utterance] = []
    runner = asyncio.create_task(ctx.run(started.append))
    threads_before = threading.active_count()
    try:
        texts = ["The werewolves wake up.", "The seer opens her eyes and points at someone.", "Night falls."]
        utts, arrivals, drains = [], [], []
        for i, text in enumerate(texts):
            if i:
                await asyncio.sleep(0.025)  # later rows arrive while the first is being synthesized
            utt = _utterance(i + 1, text)
            utts.append(utt)
            arrivals.append(time.perf_counter())
            await ctx.queue.put(utt)
            drains.append(asyncio.create_task(_drain(utt, arrivals[-1])))
        doomed = _utterance(9, "This line is cancelled before it is spoken. " * 3)
        await ctx.queue.put(doomed)
        await asyncio.sleep(0.02)
        doomed.cancel.set()
        results = await asyncio.wait_for(asyncio.gather(*drains), 10)
        # Cancelled before its first chunk was due: closed without audio, the others unharmed.
        assert await asyncio.wait_for(doomed.slices.get(), 5) is None

        assert [u.job.seq for u in started] == [1, 2, 3, 9]
        for (first_ms, audio), text in zip(results, texts, strict=True):
            # Its own TTFC after its own arrival, not after a batch window or the first row.
            assert TTFC_MS - 5 <= first_ms <= TTFC_MS + 40, first_ms
            # Whole: as long as the text says (to the slice), and sound, not silence.
            assert audio.size % SLICE_SAMPLES == 0
            assert abs(audio.size / ROOM_RATE - engine.duration_s(text)) <= SLICE_SAMPLES / ROOM_RATE
            assert float(np.sqrt(np.mean(audio.astype(np.float64) ** 2))) > 1000
        assert threading.active_count() - threads_before == 1, "one serving thread for every row"
    finally:
        runner.cancel()
        ctx.close()


def _tone(slices: int) -> bytes:
    """A 440 Hz tone, whole slices: audio no engine here would make, so its source is certain."""
    t = np.arange(slices * SLICE_SAMPLES) / ROOM_RATE
    return (8000 * np.sin(2 * np.pi * 440 * t)).astype("<i2").tobytes()


class _SlowCache(AudioCache):
    """A real cache whose answers come late (as from a Redis far away or busy)."""

    async def get(self, fp: str) -> CachedLine | None:
        await asyncio.sleep(0.15)
        return await super().get(fp)


async def _cached_context(stores: Stores, redis: Redis, ttfc_ms: float, cache_class: type[AudioCache] = AudioCache,
                          ) -> tuple[Context, SyntheticEngine, AudioCache]:
    engine = SyntheticEngine(ttfc_ms=ttfc_ms, rtf=0.05, max_batch=16, continuous=True)
    catalog = worker_catalog(Catalog.load(), {"synthetic"})
    ctx = Context("cpu#0", "cpu", {"synthetic": engine}, catalog, queue_size=8, inflight=16)
    ctx.cache = cache_class(*await stores.cache_pipes(redis), slots=64, lru_entries=0)
    return ctx, engine, ctx.cache


async def test_a_cache_hit_takes_the_line_from_an_engine_already_started(redis_url: str, stores: Stores) -> None:
    """A continuous engine starts every line at once and the cache lookup runs beside it. A hit
    answers long before a first chunk: the line is the cached audio, exactly, early, and the
    engine's row is dropped (nothing synthesized). A miss beside it starts on the engine's clock,
    not a round trip later."""
    redis = Redis.from_url(redis_url)
    ctx, engine, cache = await _cached_context(stores, redis, ttfc_ms=300.0)
    runner = asyncio.create_task(ctx.run(lambda utt: None))
    try:
        tag = uuid.uuid4().hex[:8]
        hit, miss = _utterance(1, f"The hunter takes aim {tag}."), _utterance(2, f"The village sleeps {tag}.")
        stored = _tone(12)
        assert await cache.put(ctx._fingerprint(engine, hit), stored)
        arrived = time.perf_counter()
        await ctx.queue.put(hit)
        await ctx.queue.put(miss)
        (hit_ms, hit_audio), (miss_ms, miss_audio) = await asyncio.wait_for(
            asyncio.gather(_drain(hit, arrived), _drain(miss, arrived)), 10)
        assert hit.source == "cache" and miss.source == "engine"
        assert hit_audio.tobytes() == stored, "the cached samples, nothing of the engine's"
        assert hit_ms < 150, f"a hit waits for no engine: {hit_ms:.0f} ms"
        assert 300 - 5 <= miss_ms <= 300 + 60, miss_ms
        assert abs(miss_audio.size / ROOM_RATE - engine.duration_s(miss.job.text)) <= SLICE_SAMPLES / ROOM_RATE + 1e-9
        # Past the hit's own first-chunk time: its row was dropped, nothing of it was added.
        await asyncio.sleep(0.1)
        assert hit.slices.produced == len(stored) // (2 * SLICE_SAMPLES)
        assert ctx.audio_seconds == pytest.approx(engine.duration_s(miss.job.text), abs=1e-3), "only the miss"
        assert await cache.get(ctx._fingerprint(engine, hit)) == CachedLine(stored), "the hit's entry untouched"
    finally:
        runner.cancel()
        ctx.close()
        await cache.aclose()
        await redis.aclose()


async def test_a_hit_that_comes_after_the_engine_began_steps_aside(redis_url: str, stores: Stores) -> None:
    """The other way round: the engine's first chunk (20 ms) comes before the lookup's answer
    (150 ms). The engine owns the line: its audio plays whole, the late hit changes nothing."""
    redis = Redis.from_url(redis_url)
    ctx, engine, cache = await _cached_context(stores, redis, ttfc_ms=20.0, cache_class=_SlowCache)
    runner = asyncio.create_task(ctx.run(lambda utt: None))
    try:
        utt = _utterance(1, f"The witch brews a potion {uuid.uuid4().hex[:8]}.")
        stored = _tone(12)
        assert await cache.put(ctx._fingerprint(engine, utt), stored)
        arrived = time.perf_counter()
        await ctx.queue.put(utt)
        first_ms, audio = await asyncio.wait_for(_drain(utt, arrived), 10)
        await asyncio.sleep(0.3)  # the late hit has come and gone
        assert utt.source == "engine" and utt.error is None and not utt.cancel.is_set()
        assert first_ms < 140, first_ms
        assert abs(audio.size / ROOM_RATE - engine.duration_s(utt.job.text)) <= SLICE_SAMPLES / ROOM_RATE + 1e-9
        assert audio.tobytes()[:len(stored)] != stored
        assert utt.slices.produced == audio.size // SLICE_SAMPLES, "nothing was added after the end"
    finally:
        runner.cancel()
        ctx.close()
        await cache.aclose()
        await redis.aclose()


class _BrokenAtStart(SyntheticEngine):
    """Fails before it ever asks for a row (an engine closed, or never loaded)."""

    def stream_continuous(self, admit):  # type: ignore[no-untyped-def]
        raise RuntimeError("engine gone")
        yield  # a generator, as the real ones are


async def test_lines_handed_to_an_engine_that_fails_before_taking_them_end_failed() -> None:
    """Before, such a line stayed in the dead thread's inbox forever and its room hung."""
    engine = _BrokenAtStart(ttfc_ms=TTFC_MS, rtf=0.05, max_batch=16, continuous=True)
    catalog = worker_catalog(Catalog.load(), {"synthetic"})
    ctx = Context("cpu#0", "cpu", {"synthetic": engine}, catalog, queue_size=8, inflight=16)
    runner = asyncio.create_task(ctx.run(lambda _utt: None))
    try:
        # Each line starts a new serving thread that dies at once: the thread's death races the
        # hand-off (CI once caught a line put into the inbox of a thread already gone).
        for seq in range(1, 21):
            utt = _utterance(seq, "Nobody will say this.")
            await ctx.queue.put(utt)
            assert await asyncio.wait_for(utt.slices.get(), 10) is None, "closed, not left waiting"
            assert utt.error is not None and "engine gone" in utt.error
            ctx.release(utt)  # as its publisher would: the line's slot is free again
    finally:
        runner.cancel()
        ctx.close()


class _CountingEngine(SyntheticEngine):
    """Notes how many lines each of its wake-ups took in (``admit`` with something to give)."""

    def __init__(self) -> None:
        super().__init__(ttfc_ms=TTFC_MS, rtf=0.05, max_batch=32, continuous=True)
        self.intakes: list[int] = []

    def stream_continuous(self, admit: Admit) -> Iterator[tuple[Hashable, Pcm | None]]:
        def counted(timeout: float | None) -> list[tuple[Hashable, SynthesisRequest, threading.Event]] | None:
            got = admit(timeout)
            if got:
                self.intakes.append(len(got))
            return got

        return super().stream_continuous(counted)


async def test_lines_admitted_in_one_loop_turn_reach_the_engine_in_one_wake_up() -> None:
    """The runner admits a burst's lines in one loop turn and hands the GIL to the engine's
    thread once, after the turn: the engine takes them in one wake-up and starts them together.
    Before, the loop waited for the engine thread's wake-up after every line (docs/benchmarks.md,
    "Where a burst's median line waits"). The switch interval is raised so that the only
    hand-overs are the context's own, not the interpreter's every 5 ms."""
    engine = _CountingEngine()
    catalog = worker_catalog(Catalog.load(), {"synthetic"})
    ctx = Context("cpu#0", "cpu", {"synthetic": engine}, catalog, queue_size=16, inflight=32)
    started: list[Utterance] = []
    runner = asyncio.create_task(ctx.run(started.append))
    interval = sys.getswitchinterval()
    sys.setswitchinterval(5.0)
    try:
        warm = _utterance(1, "Night falls.")  # starts the engine's thread
        await ctx.queue.put(warm)
        await asyncio.wait_for(_drain(warm, time.perf_counter()), 10)
        engine.intakes.clear()
        burst = [_utterance(seq, f"Line {seq} of the burst.") for seq in range(2, 12)]
        for utt in burst:  # one loop turn: the queue has room, nothing here suspends
            ctx.queue.put_nowait(utt)
        results = await asyncio.wait_for(asyncio.gather(*(_drain(u, time.perf_counter()) for u in burst)), 10)
        assert [u.job.seq for u in started] == list(range(1, 12))
        assert engine.intakes == [len(burst)], engine.intakes
        for (_first_ms, audio), utt in zip(results, burst, strict=True):
            assert abs(audio.size / ROOM_RATE - engine.duration_s(utt.job.text)) <= SLICE_SAMPLES / ROOM_RATE
    finally:
        sys.setswitchinterval(interval)
        runner.cancel()
        ctx.close()
