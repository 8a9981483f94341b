"""A continuous-batching engine in a context: rows join the running batch at any moment, each
starts ``ttfc`` after its own arrival (no batch window), one thread serves them all, and a
cancelled row stops alone. The engine is the synthetic benchmark engine (it sleeps instead of
computing), driven by the real context code with real threads."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np

from voxroom.protocol import ROOM_RATE, SLICE_SAMPLES
from voxroom.voices import Catalog
from workers.context import Context
from workers.engines.synthetic import SyntheticEngine
from workers.job import Job, SliceBuffer, Utterance
from workers.launch import worker_catalog

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
