"""The job queue's ``accept`` test (``workers/pool/line_queue.py``): lines whose engine has no free place
are passed over, their rooms keep their turn, adopted lines still come first among the lines that
may go, and a waiting ``get`` takes a passed-over line once :meth:`JobQueue.wake` says a place
opened."""

from __future__ import annotations

import asyncio

from voxroom.wire.jobs import Job
from workers.pool.line_queue import JobQueue
from workers.utterance import SliceBuffer, Utterance


def utt(room: str, seq: int, voice: str = "gpu") -> Utterance:
    job = Job(entry_id=f"{room}-{seq}", room=room, seq=seq, text="A line.", voice=voice, prev_voice=voice,
              sender="t", time_ms=0.0)
    return Utterance(job=job, slices=SliceBuffer(asyncio.get_running_loop()))


def name(u: Utterance) -> str:
    return f"{u.job.room}{u.job.seq}"


async def test_a_room_passed_over_keeps_its_turn() -> None:
    q = JobQueue(maxsize=4, backlog=16)
    for line in (utt("a", 1), utt("b", 1, voice="cpu"), utt("c", 1), utt("a", 2)):
        q.put_nowait(line)
    full = {"gpu"}  # the continuous engine has no free place; the other engine has
    take = q.get_nowait(lambda u: u.job.voice not in full)
    assert name(take) == "b1", "a line for an engine with room passes the full one's"
    full.clear()
    # a was first in the rotation and still is: it was passed over, not served
    assert [name(q.get_nowait(lambda u: True)) for _ in range(3)] == ["a1", "c1", "a2"]


async def test_adopted_lines_come_first_among_those_that_may_go() -> None:
    q = JobQueue(maxsize=4, backlog=16)
    q.put_nowait(utt("a", 1))
    adopted_gpu, adopted_cpu = utt("x", 1), utt("y", 1, voice="cpu")
    for line in (adopted_gpu, adopted_cpu):
        line.adopted = True
        q.put_first(line)
    assert name(q.get_nowait(lambda u: u.job.voice == "cpu")) == "y1"
    assert name(q.get_nowait()) == "x1", "the adopted line first once its engine has a place"
    assert name(q.get_nowait()) == "a1"


async def test_first_come_first_served_waits_at_its_head() -> None:
    q = JobQueue(maxsize=4, fair=False)
    q.put_nowait(utt("a", 1))
    q.put_nowait(utt("b", 1, voice="cpu"))
    assert q._take(lambda u: u.job.voice == "cpu") is None, "the FIFO keeps its order"


async def test_get_waits_for_a_place_then_takes_the_queue_s_pick() -> None:
    q = JobQueue(maxsize=4, backlog=16)
    places = 0
    q.put_nowait(utt("a", 1))
    q.put_nowait(utt("b", 1))
    getter = asyncio.create_task(q.get(lambda u: places > 0))
    await asyncio.sleep(0.05)
    assert not getter.done(), "no place: the line stays queued"
    places = 1
    q.wake()
    got = await asyncio.wait_for(getter, 5)
    assert name(got) == "a1" and q.qsize() == 1
