"""Windowed batches: a context collects lines for one engine during ``batch_window_ms``, then runs
them together to their end on its thread (engines that are not continuous; a one-row engine runs
one line at a time).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import TypeGuard

from workers.audio_cache.cache import CachedLine
from workers.engines.base import BatchEngine, Engine, SynthesisRequest
from workers.pool.line_queue import JobQueue
from workers.pool.row_audio import Meter, Row
from workers.utterance import Utterance

log = logging.getLogger("voxroom.worker.context")


def batches(engine: Engine) -> TypeGuard[BatchEngine]:
    """A batch engine with room for more than one row. Not ``isinstance(engine, BatchEngine)``
    per job: a runtime-checked Protocol inspects the class on every call (about 10 µs)."""
    return getattr(engine, "max_batch", 1) > 1 and callable(getattr(engine, "stream_batch", None))


async def gather(engine: Engine, queue: JobQueue, slots: asyncio.Semaphore, window_s: float,
                 engine_for: Callable[[Utterance], Engine | None],
                 taken: Callable[[Utterance], None]) -> list[Utterance]:
    """More jobs for ``engine`` that arrive within the window, as many as there are free slots:
    never a wait on a slot. Slots come back only when publishing ends, and publishing cannot
    start before this batch is synthesized: with ``inflight`` below the engine's batch, waiting
    here for a slot hung the context for good. A job for another engine goes back to the head of
    the queue and ends the window. The caller must be the only one acquiring ``slots``."""
    more: list[Utterance] = []
    deadline = time.monotonic() + window_s
    while len(more) + 1 < engine.max_batch and not slots.locked():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        try:
            utt = await asyncio.wait_for(queue.get(), remaining)
        except TimeoutError:
            break
        if engine_for(utt) is not engine:
            queue.put_back(utt)
            break
        await slots.acquire()  # never waits: not locked, and only this runner acquires
        taken(utt)
        more.append(utt)
    return more


def synthesize(name: str, engine: Engine, batch: Sequence[Utterance],
               request: Callable[[Utterance], SynthesisRequest], *, keep: bool, max_slices: int,
               meter: Meter) -> list[CachedLine | None]:
    """Run ``batch`` on ``engine`` to its end (on the context's thread); every row's audio and
    word marks for the audio cache when ``keep`` (see :meth:`Row.finish`). A line alone on an
    engine that times its words (``TimedEngine``) gets its marks; rows of a batch get the marks
    the batch engine yields beside their audio (ChatTTS's, per text piece). An engine failure
    fails the batch's lines, never the context."""
    started = time.perf_counter()
    rows = [Row(utt, engine.sample_rate, max_slices=max_slices, keep=keep, started=started) for utt in batch]
    try:
        if len(rows) > 1 and batches(engine):
            for i, item in engine.stream_batch([request(u) for u in batch], [u.cancel for u in batch]):
                if isinstance(item, list):  # word marks (base.RowItem)
                    rows[i].mark(item)
                else:
                    rows[i].feed(item)
        else:
            timed = getattr(engine, "stream_timed", None)
            if callable(timed):
                row = rows[0]
                for item in timed(request(batch[0]), batch[0].cancel):
                    if isinstance(item, list):
                        row.mark(item)
                    else:
                        row.feed(item)
            else:
                for pcm in engine.stream(request(batch[0]), batch[0].cancel):
                    rows[0].feed(pcm)
    except Exception as exc:
        log.exception("context %s: engine %s failed", name, engine.name)
        for row in rows:
            row.fail(f"{type(exc).__name__}: {exc}")
    finally:
        pcms = [row.finish(meter) for row in rows]
        meter.synth_seconds += time.perf_counter() - started
    return pcms
