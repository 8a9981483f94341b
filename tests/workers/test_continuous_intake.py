"""A continuous engine's intake (issue 14): the context hands it at most ``max_batch`` plus
``SPARE_ROWS`` lines not yet finished, and the rest wait in the context's queue, whose order
(rooms in turn, the room that runs out of audio soonest first) decides which line takes each row
that frees. Before, every line the context took went into the engine's own FIFO at once: a room
that had queued 16 lines filled it, and rooms that spoke after it waited for all of them.

The engine runs at most ``max_batch`` rows and queues the rest first in, first out, as ChatTTS's
batcher does (``tests/support/fifo_engine.py``, the synthetic engine with that limit). Judged by the
order of what happened to each line in the engine, never by milliseconds.
"""

from __future__ import annotations

import asyncio
import functools

from redis.asyncio import Redis

from tests.support import waiting
from tests.support.fifo_engine import FifoEngine
from tests.support.outputs import add_jobs
from tests.support.stores import Stores
from voxroom.store import keys
from voxroom.voices.catalog import Catalog
from voxroom.wire.jobs import Job
from workers.engines.base import Engine
from workers.intake.worker import Worker
from workers.launch import worker_catalog
from workers.pool import continuous_rows as rows
from workers.pool.context import Context
from workers.pool.pool import ContextPool
from workers.utterance import SliceBuffer, Utterance

until = functools.partial(waiting.until, timeout=60.0, every=0.02)

MAX_BATCH = 2
CAP = MAX_BATCH + rows.SPARE_ROWS
FLOOD = "The werewolves wake up and choose, in silence, who will not see the morning."  # about 6 s
SINGLE = "Hello there."  # under a second
SINGLES = 6



async def test_rooms_that_speak_after_a_flood_take_the_freed_rows_before_it(r: Redis, stores: Stores) -> None:
    """Room F queues 16 lines; once its first line sounds, six rooms say one line each. The engine
    holds F's first ``CAP`` lines (nothing else was queued) and never more than ``CAP``; every
    row that frees goes to a single-line room (F has seconds of audio buffered, they have none),
    so each of them is handed over, and sounds, before F's line ``CAP + 1``. Before, F's 16 lines
    were all in the engine's FIFO ahead of them."""
    engine = FifoEngine(ttfc_ms=150.0, rtf=0.05, max_batch=MAX_BATCH)

    def engines(device: str) -> dict[str, Engine]:
        return {"synthetic": engine}

    catalog = worker_catalog(Catalog.load(), {"synthetic"})
    # Room for every single-line room in the queue at once: what is judged here is the hand-over
    # to the engine, not how fast the worker reads Redis.
    pool = ContextPool(["cpu"], engines, catalog, queue_size=16, inflight=64, backlog=64)
    await r.xgroup_create(keys.JOBS, keys.JOBS_GROUP, id="0", mkstream=True)
    await add_jobs(r, [("F", FLOOD)] * 16)
    worker = Worker(await stores.open(r), pool, catalog, shutdown_timeout_s=1.0, claim_idle_ms=5000)
    task = asyncio.create_task(worker.run(), name="test:worker")
    singles = [f"s{i}/1" for i in range(SINGLES)]
    nxt = f"F/{CAP + 1}"
    try:
        await until(lambda: engine.happened("first", "F/1"), lambda: f"F/1 never sounded: {engine.events}")
        await add_jobs(r, [(line.split("/")[0], SINGLE) for line in singles])
        await until(lambda: all(engine.happened("first", s) for s in singles) and engine.happened("first", nxt),
                    lambda: f"events: {engine.events}")
        assert not task.done(), task
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)

    assert engine.most_held <= CAP, f"the engine held {engine.most_held} lines, more than {CAP}"
    assert engine.most_held == CAP, "a free place was left unused while lines waited"
    handed = [line for what, line in engine.events if what == "handed"]
    assert handed[:CAP] == [f"F/{i}" for i in range(1, CAP + 1)], handed
    for single in singles:
        assert engine.index("handed", single) < engine.index("handed", nxt), handed
        assert engine.index("first", single) < engine.index("first", nxt), engine.events
    flood = [line for line in handed if line.startswith("F/")]
    assert flood == [f"F/{i}" for i in range(1, len(flood) + 1)], "the flood's lines in order"


def _line(seq: int, text: str) -> Utterance:
    job = Job(entry_id=f"{seq}-0", room=f"room-{seq}", seq=seq, text=text, voice="en-espeak",
              prev_voice="en-espeak", sender="t", time_ms=0.0)
    return Utterance(job=job, slices=SliceBuffer(asyncio.get_running_loop()))


def _context(engine: FifoEngine, max_slices: int = 4096) -> Context:
    catalog = worker_catalog(Catalog.load(), {"synthetic"})
    return Context("cpu#0", "cpu", {"synthetic": engine}, catalog, queue_size=8, inflight=16,
                   max_slices=max_slices)


async def _drain(utt: Utterance) -> None:
    while await asyncio.wait_for(utt.slices.get(), 30) is not None:
        pass


async def test_a_cancelled_line_frees_its_place_waiting_or_running() -> None:
    """Five lines, ``CAP`` (3) places, an engine whose first chunk is far away: it holds lines 1
    and 2 in rows, line 3 in its FIFO, and lines 4 and 5 stay in the context's queue. Line 3 is
    cancelled where it waits (as a cache hit or a lost job cancels it): its place goes to line 4.
    Line 1 is cancelled in its row: its place goes to line 5, its row to line 3's successor."""
    engine = FifoEngine(ttfc_ms=60_000.0, rtf=0.05, max_batch=MAX_BATCH)
    ctx = _context(engine)
    runner = asyncio.create_task(ctx.run(lambda utt: None))
    lines = [_line(seq, FLOOD) for seq in range(1, 6)]
    try:
        for utt in lines:
            await ctx.queue.put(utt)
        await until(lambda: engine.happened("handed", "room-3/3"), lambda: f"events: {engine.events}")
        assert ctx.queue.qsize() == 2 and ctx._rows.held(engine) == CAP
        assert [line for what, line in engine.events if what == "joined"] == ["room-1/1", "room-2/2"]

        lines[2].cancel.set()
        await until(lambda: engine.happened("handed", "room-4/4"), lambda: f"events: {engine.events}")
        assert engine.index("done", "room-3/3") < engine.index("handed", "room-4/4")
        assert ctx.queue.qsize() == 1

        lines[0].cancel.set()
        await until(lambda: engine.happened("joined", "room-4/4") and engine.happened("handed", "room-5/5"),
                    lambda: f"events: {engine.events}")
        assert engine.index("done", "room-1/1") < engine.index("handed", "room-5/5")
        assert ctx.queue.qsize() == 0
        for utt in lines:
            utt.cancel.set()
        await asyncio.gather(*(_drain(utt) for utt in lines))
        await until(lambda: ctx._rows.held(engine) == 0, lambda: f"held {ctx._rows.held(engine)}")
    finally:
        runner.cancel()
        ctx.close()
    assert engine.most_held == CAP, engine.events
    assert all(utt.slices.produced == 0 for utt in lines)


async def test_a_line_cut_at_its_length_limit_frees_its_place() -> None:
    """Four 6 s lines cut at 25 slices (1 s, ``VOXROOM_MAX_UTTERANCE_MS``): the fourth line gets
    a place only when a cut line left, and every line ends, cut where it should be."""
    engine = FifoEngine(ttfc_ms=100.0, rtf=0.05, max_batch=MAX_BATCH)
    ctx = _context(engine, max_slices=25)
    runner = asyncio.create_task(ctx.run(lambda utt: None))
    lines = [_line(seq, FLOOD) for seq in range(1, 5)]
    try:
        for utt in lines:
            await ctx.queue.put(utt)
        await asyncio.gather(*(_drain(utt) for utt in lines))
        assert engine.most_held == CAP, engine.events
        await until(lambda: ctx._rows.held(engine) == 0, lambda: f"held {ctx._rows.held(engine)}")
    finally:
        runner.cancel()
        ctx.close()
    first_done = next(i for i, (what, _) in enumerate(engine.events) if what == "done")
    assert engine.events[first_done][1] in ("room-1/1", "room-2/2"), engine.events
    assert first_done < engine.index("handed", "room-4/4"), engine.events
    for utt in lines:
        assert utt.slices.produced == 25 and utt.cancel.is_set() and utt.error is None, utt.job.seq
