"""An open line spoken by ChatTTS (issue 31), through the real parts that serve it: its pieces stored
by the store's ingress in a real redis-server, read by the open line's feed
(workers/pool/open_line.py) through the real job bus, each clause handed to the real context's
continuous ChatTTS engine (the tiny checkpoint, argmax sampling so that a clause can be compared
with itself). The line's audio is, sample for sample, its clauses said alone with the same voice
on the same engine, joined: one speaker embedding and seed for the whole line, each clause its own
generation (its text is a prompt, not a continuation).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from redis.asyncio import Redis

from tests.chattts.conftest import VOICES, make_engine
from tests.support.stores import Stores
from voxroom.store.interface import IngressOptions
from voxroom.store.server import RedisServer
from voxroom.voices.catalog import Catalog
from voxroom.wire.jobs import Job
from workers.engines.chattts import ChatTTSEngine
from workers.output.clock import RoomClock
from workers.pool import open_line
from workers.pool.context import Context
from workers.utterance import SliceBuffer, Utterance

pytestmark = pytest.mark.chattts

FIRST = "The wolves wake,"
PARTS = [" the seer sleeps,", " and the village dreams."]


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    with RedisServer() as server:
        yield server.url


@pytest.fixture(scope="module")
def greedy_continuous(tiny_dir: Path) -> Iterator[ChatTTSEngine]:
    e = make_engine(tiny_dir, temperature=0.0, fade_ms=0.0, continuous=True, min_new_tokens=20,
                    max_new_tokens=30)
    yield e
    e.close()


async def drain(utt: Utterance) -> np.ndarray:
    slices = []
    while (piece := await utt.slices.get()) is not None:
        slices.append(piece)
    return np.concatenate(slices) if slices else np.zeros(0, np.int16)


async def test_three_appends_are_the_three_clauses_said_alone_joined(
        greedy_continuous: ChatTTSEngine, redis_url: str, stores: Stores) -> None:
    engine = greedy_continuous
    catalog = Catalog([VOICES["a"], VOICES["b"]], "a")
    ctx = Context("cpu#0", "cpu", {"chattts": engine}, catalog, queue_size=4, inflight=8)
    runner = asyncio.create_task(ctx.run(lambda utt: None))
    r = Redis.from_url(redis_url)
    room = f"open-{uuid.uuid4().hex[:8]}"
    try:
        store = await stores.open(redis_url)
        ingress = store.ingress(IngressOptions())
        bus = await stores.bus(redis_url, "w-open")
        assert (await ingress.say(room, "gm", 7, FIRST, "a", open_line=True)).status == "accepted"
        for part, text in enumerate(PARTS, start=1):
            await ingress.append(room, "gm", 7, part, text, final=part == len(PARTS))
        job = Job(entry_id="1-0", room=room, seq=1, text=FIRST, voice="a", prev_voice="a", sender="gm",
                  time_ms=0.0, open_seq=7)
        line = Utterance(job=job, slices=SliceBuffer(asyncio.get_running_loop()))
        line.claim("engine")
        feed = asyncio.create_task(open_line.feed(bus, ctx, engine, line, idle_s=30.0, clock=RoomClock()))
        spoken = await asyncio.wait_for(drain(line), 120)
        await feed
        assert line.error is None
        assert list(line.texts) == [(len(FIRST), PARTS[0]), (len(FIRST) + len(PARTS[0]), PARTS[1])]

        # The same clauses, each a line of its own, through the same context and engine.
        alone = []
        for i, text in enumerate([FIRST, *PARTS]):
            solo = Utterance(job=Job(entry_id=f"{i + 2}-0", room=f"{room}-solo", seq=i + 1, text=text, voice="a",
                                     prev_voice="a", sender="gm", time_ms=0.0),
                             slices=SliceBuffer(asyncio.get_running_loop()))
            await ctx.queue.put(solo)
            alone.append(await asyncio.wait_for(drain(solo), 120))
        joined = np.concatenate(alone)
        assert spoken.size == joined.size > 0
        np.testing.assert_array_equal(spoken, joined)
        assert all(a.size > 0 and float(np.sqrt(np.mean(a.astype(np.float64) ** 2))) > 30 for a in alone)
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        ctx.close()
        await r.aclose()
