"""Contexts that differ in engines (an optional engine failed to load on one): the pool queues a
job only where its voice's engine is, whatever the caller names, and a job that reaches a context
without its engine ends failed, in its turn, while the context's runner goes on serving. Real
pool, real contexts and runners; the engines are synthetic ones (they sleep instead of computing)."""

from __future__ import annotations

import asyncio
import itertools

import numpy as np

from voxroom.voices.catalog import Catalog, Voice
from voxroom.wire.jobs import Job
from workers.engines.base import Engine
from workers.engines.synthetic import SyntheticEngine
from workers.pool.context import Context
from workers.pool.pool import ContextPool
from workers.utterance import SliceBuffer, Utterance

OTHER_VOICE = "en-espeak"
"""Spoken by the engine named ``other`` here; every other voice by ``synthetic``."""


def two_engine_catalog() -> Catalog:
    base = Catalog.load()
    return Catalog([Voice(v.id, "other" if v.id == OTHER_VOICE else "synthetic", v.language, v.name, v.tags,
                          v.params) for v in base], base.default)


def engine() -> SyntheticEngine:
    return SyntheticEngine(ttfc_ms=10.0, rtf=0.01)


seqs = itertools.count(1)


def line(voice: str) -> Utterance:
    seq = next(seqs)
    job = Job(entry_id=f"{seq}-0", room=f"eng-{seq}", seq=seq, text="Hi there.", voice=voice, prev_voice=voice,
              sender="t", time_ms=0.0)
    return Utterance(job=job, slices=SliceBuffer(asyncio.get_running_loop()))


async def drain(ctx: Context, utt: Utterance) -> int:
    """Play ``utt`` out as a publisher would (then give its slot back); its audio's samples."""
    samples = 0
    while (piece := await asyncio.wait_for(utt.slices.get(), 10)) is not None:
        samples += int(np.count_nonzero(piece))
    ctx.release(utt)
    return samples


async def test_the_pool_queues_a_job_only_where_its_voices_engine_is() -> None:
    made = iter([{"other": engine()}, {"synthetic": engine()}])

    def engines(device: str) -> dict[str, Engine]:
        return dict(next(made))

    pool = ContextPool(["cpu", "cpu"], engines, two_engine_catalog(), queue_size=4, inflight=4)
    only_other, only_synthetic = pool.contexts
    started: list[Utterance] = []
    runners = [asyncio.create_task(c.run(started.append), name=f"test:{c.name}") for c in pool.contexts]
    try:
        # The caller names the wrong engine (the one context 0 holds): the voice decides.
        joes = [line("en-joe") for _ in range(3)]
        for utt in joes:
            assert pool.submit(utt, "other") is only_synthetic
        other = line(OTHER_VOICE)
        assert pool.submit(other, "other") is only_other
        adopted = line("en-joe")
        assert pool.adopt(adopted, "other") is only_synthetic
        for utt in [*joes, adopted]:
            assert await drain(only_synthetic, utt) > 0 and utt.error is None, utt.job
        assert await drain(only_other, other) > 0 and other.error is None
        assert not any(r.done() for r in runners), "both runners still serve"

        # An engine no context holds (as when it failed to load): nowhere to queue the job.
        del only_other.engines["other"]
        only_other.engines["spare"] = engine()
        pool.engines_loaded()
        assert not pool.serves("other")
        assert pool.submit(line(OTHER_VOICE), "other") is None
        assert pool.adopt(line(OTHER_VOICE)) is None
        assert pool.load() == 0
    finally:
        for r in runners:
            r.cancel()
        await asyncio.gather(*runners, return_exceptions=True)
        pool.close()


async def test_a_context_fails_a_job_for_an_engine_it_lacks_and_goes_on() -> None:
    ctx = Context("cpu#0", "cpu", {"synthetic": engine()}, two_engine_catalog(), queue_size=4, inflight=4)
    started: list[Utterance] = []
    runner = asyncio.create_task(ctx.run(started.append), name="test:context")
    try:
        # Queued straight on the context, as a job would be whose engine was dropped after.
        lost, unknown, fine = line(OTHER_VOICE), line("no-such-voice"), line("en-joe")
        for utt in (lost, unknown, fine):
            await ctx.queue.put(utt)
        assert await drain(ctx, lost) == 0
        assert lost.error is not None and "'other'" in lost.error, lost.error
        assert await drain(ctx, unknown) == 0
        assert unknown.error is not None and "no-such-voice" in unknown.error, unknown.error
        assert await drain(ctx, fine) > 0 and fine.error is None
        assert started == [lost, unknown, fine], "each handed to its publisher, in its turn"
        assert not runner.done(), "the runner goes on"
        assert (ctx.active, ctx.load, ctx.playing) == (0, 0, {})
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        ctx.close()
