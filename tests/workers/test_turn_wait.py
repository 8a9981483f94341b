"""A line waits for its predecessor in the room (workers/output/publisher.py ``wait_for_turn``) and skips
past it only after ``order_wait_ms`` in which the room made no progress: a predecessor still
playing, however long, is heard whole before it; one that never starts, or stops mid-line, is
skipped. The real publisher of two workers (two consumers of the jobs group) against a real
redis-server, and the room's output stream as every listener gets it."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import numpy as np
from redis.asyncio import Redis

from app.fanout.entries import client_items
from tests.support.outputs import problems, read_out
from tests.support.stores import Stores
from voxroom.store import keys
from voxroom.store.jobs import FencedJobBus
from voxroom.wire.jobs import Job
from voxroom.wire.protocol import CODEC_PCM16, SLICE_MS, SLICE_SAMPLES, AudioFrame
from workers.output.clock import RoomClock
from workers.output.publisher import PublishResult, publish_utterance
from workers.utterance import SliceBuffer, Utterance

ORDER_WAIT_MS = 1500
LONG_MS = 4000
"""Line 1 plays this long: well past ``ORDER_WAIT_MS``, with room to spare on a busy machine."""
BOUND_S = 30.0
"""No publish here may take longer (a hung wait fails the test instead of holding it)."""


async def _take(r: Redis, bus: FencedJobBus, room: str, seq: int) -> Job:
    """Put line ``seq`` of ``room`` in ``vx:jobs`` and have ``bus``'s worker take it."""
    await bus.ensure_group()
    await r.xadd(keys.JOBS, {"room": room, "seq": seq, "text": f"Line {seq}.", "voice": "en-joe",
                             "prev_voice": "en-joe", "sender": "tester", "time": 0})
    jobs = await bus.read_jobs(1, 1000)
    assert [(job.room, job.seq) for job in jobs] == [(room, seq)]
    return jobs[0]


def _utterance(job: Job, ms: float, *, done: bool = True) -> Utterance:
    """A synthesized line of ``ms`` of audio (``done=False``: its engine never finishes it)."""
    utt = Utterance(job=job, slices=SliceBuffer(asyncio.get_running_loop()))
    utt.slices.extend([np.full(SLICE_SAMPLES, 1000 * job.seq, dtype=np.int16)] * math.ceil(ms / SLICE_MS))
    if done:
        utt.slices.close()
    return utt


async def _publish(bus: FencedJobBus, utt: Utterance) -> PublishResult:
    return await publish_utterance(bus, utt, RoomClock(), lead_ms=120, order_wait_ms=ORDER_WAIT_MS,
                                   voice_name="en-joe")


async def _frames(raw: Redis, room: str) -> list[AudioFrame]:
    """The audio frames a PCM client of ``room`` gets, in the order it gets them."""
    entries: Any = await raw.xrange(keys.room_output(room))
    items = client_items([[i, [x for kv in f.items() for x in kv]] for i, f in entries], CODEC_PCM16, "anyone")
    return [AudioFrame.decode(item) for item in items if isinstance(item, bytes)]


async def _wait_started(raw: Redis, room: str) -> None:
    """Until the room's first output entry is there (its first line's ``start``)."""
    got: Any = await raw.xread({keys.room_output(room): "0-0"}, count=1, block=int(BOUND_S * 1000))
    assert got, "the first line never started"


async def test_a_line_waits_out_a_predecessor_that_plays_longer_than_the_order_wait(r: Redis, raw: Redis, stores: Stores) -> None:
    """The room is told two lines faster than real time: line 2, synthesized and waiting on
    another worker, must not skip past line 1 while line 1 still plays (before, the wait counted
    from when line 2 began to wait: after 1.5 s it skipped, and the two lines' audio interleaved)."""
    room = "turn-long"
    a, b = await stores.bus(r, "w-a"), await stores.bus(r, "w-b")
    try:
        first = _utterance(await _take(r, a, room, 1), LONG_MS)
        second = _utterance(await _take(r, b, room, 2), 500)
        playing = asyncio.create_task(_publish(a, first))
        await _wait_started(raw, room)  # line 2 begins to wait with nearly all of line 1 to play
        async with asyncio.timeout(BOUND_S):
            results = [await _publish(b, second), await playing]
        assert [res.status for res in results] == ["ok", "ok"]
        out = await read_out(raw, room)
        assert problems(out, 2) == []
        seqs = [e.seq for e in out]
        assert seqs == sorted(seqs), "line 2 published while line 1 was still playing"
        frames = await _frames(raw, room)
        ones = [f for f in frames if f.seq == 1]
        twos = [f for f in frames if f.seq == 2]
        assert [f.chunk for f in ones] == list(range(math.ceil(LONG_MS / SLICE_MS)))
        assert [f.chunk for f in twos] == list(range(math.ceil(500 / SLICE_MS)))
        # Heard one after the other: line 2's first sample plays where line 1's audio ends.
        assert twos[0].pts_us >= ones[-1].pts_us + ones[-1].duration_us
        assert (await a.room_turn(room)).next == 3
    finally:
        await a.close()
        await b.close()


async def test_a_predecessor_that_never_starts_is_skipped(r: Redis, raw: Redis, stores: Stores) -> None:
    """Line 1's job is lost (nobody will ever publish it): after ``order_wait_ms`` of silence line
    2 skips past it and plays whole; line 1, should it turn up after all, is dropped as stale."""
    room = "turn-lost"
    a, b = await stores.bus(r, "w-a"), await stores.bus(r, "w-b")
    try:
        second = _utterance(await _take(r, b, room, 2), 300)
        async with asyncio.timeout(BOUND_S):
            result = await _publish(b, second)
        assert result.status == "ok"
        out = await read_out(raw, room)
        assert [(e.kind, e.seq) for e in out if e.kind != "chunk"] == [("start", 2), ("end", 2)]
        assert [e.chunk for e in out if e.kind == "chunk"] == list(range(math.ceil(300 / SLICE_MS)))
        assert (await b.room_turn(room)).next == 3
        late = _utterance(await _take(r, a, room, 1), 300)
        async with asyncio.timeout(BOUND_S):
            assert (await _publish(a, late)).status == "skipped"
        assert late.cancel.is_set()
        assert len(await read_out(raw, room)) == len(out), "the late line wrote nothing"
    finally:
        await a.close()
        await b.close()


async def test_a_predecessor_that_stops_mid_line_is_skipped(r: Redis, raw: Redis, stores: Stores) -> None:
    """Progress restarts the wait, and only progress: line 1 plays half a second, then its engine
    never gives another slice; line 2 skips past it after ``order_wait_ms`` of silence."""
    room = "turn-stuck"
    a, b = await stores.bus(r, "w-a"), await stores.bus(r, "w-b")
    stuck: asyncio.Task[PublishResult] | None = None
    try:
        first = _utterance(await _take(r, a, room, 1), 500, done=False)
        second = _utterance(await _take(r, b, room, 2), 300)
        stuck = asyncio.create_task(_publish(a, first))
        await _wait_started(raw, room)
        async with asyncio.timeout(BOUND_S):
            result = await _publish(b, second)
        assert result.status == "ok"
        assert not stuck.done(), "line 1 is still waiting for its engine"
        out = await read_out(raw, room)
        assert [(e.kind, e.seq) for e in out if e.kind != "chunk"] == [("start", 1), ("start", 2), ("end", 2)]
        ones = [e.chunk for e in out if e.kind == "chunk" and e.seq == 1]
        assert ones == list(range(math.ceil(500 / SLICE_MS)))  # all it had, before line 2 began
        assert out.index(next(e for e in out if e.seq == 2)) == len(ones) + 1
    finally:
        if stuck is not None:
            stuck.cancel()
            await asyncio.gather(stuck, return_exceptions=True)
        await a.close()
        await b.close()


async def test_lines_behind_a_lost_one_skip_it_once_and_play_in_order(r: Redis, raw: Redis, stores: Stores) -> None:
    """Lines 2 and 3 wait together behind a lost line 1: line 2 skips past it, and line 3 then
    waits for line 2 as for any predecessor (the skip, a move of the turn, starts its wait again)
    instead of skipping past line 2 too when its own wait, begun with line 2's, runs out."""
    room = "turn-two-behind"
    a, b = await stores.bus(r, "w-a"), await stores.bus(r, "w-b")
    try:
        second = _utterance(await _take(r, a, room, 2), LONG_MS)
        third = _utterance(await _take(r, b, room, 3), 300)
        async with asyncio.timeout(BOUND_S):
            results = await asyncio.gather(_publish(a, second), _publish(b, third))
        assert [res.status for res in results] == ["ok", "ok"]
        out = await read_out(raw, room)
        assert [(e.kind, e.seq) for e in out if e.kind != "chunk"] == [("start", 2), ("end", 2), ("start", 3),
                                                                      ("end", 3)]
        frames = await _frames(raw, room)
        twos = [f for f in frames if f.seq == 2]
        threes = [f for f in frames if f.seq == 3]
        assert [f.chunk for f in twos] == list(range(math.ceil(LONG_MS / SLICE_MS)))
        assert [f.chunk for f in threes] == list(range(math.ceil(300 / SLICE_MS)))
        assert threes[0].pts_us >= twos[-1].pts_us + twos[-1].duration_us
        assert (await a.room_turn(room)).next == 4
    finally:
        await a.close()
        await b.close()
