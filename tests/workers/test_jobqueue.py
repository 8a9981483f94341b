"""A context's job queue on its own: rooms in turn, a room's lines in seq order, the room that
runs out of audio soonest first, and every bound (``workers/jobqueue.py``)."""

from __future__ import annotations

import asyncio

import pytest

from workers.job import Job, SliceBuffer, Utterance
from workers.jobqueue import URGENT_MS, JobQueue


def utt(room: str, seq: int) -> Utterance:
    job = Job(entry_id=f"{room}-{seq}", room=room, seq=seq, text="A line.", voice="en-joe",
              prev_voice="en-joe", sender="t", time_ms=0.0)
    return Utterance(job=job, slices=SliceBuffer(asyncio.get_running_loop()))


def drain(q: JobQueue) -> list[str]:
    out = []
    while not q.empty():
        u = q.get_nowait()
        out.append(f"{u.job.room}{u.job.seq}")
    return out


async def test_rooms_are_taken_in_turn_each_in_seq_order() -> None:
    q = JobQueue(maxsize=4, backlog=16)
    for seq in range(1, 6):
        q.put_nowait(utt("F", seq))
    for room in ("a", "b", "c"):
        q.put_nowait(utt(room, 1))
    # Before, one FIFO: F1..F5 then a, b, c.
    assert drain(q) == ["F1", "a1", "b1", "c1", "F2", "F3", "F4", "F5"]


async def test_a_later_line_read_first_is_still_taken_after_the_earlier() -> None:
    q = JobQueue(maxsize=4, backlog=16)
    for seq in (2, 1, 4, 3):
        q.put_nowait(utt("r", seq))
    assert drain(q) == ["r1", "r2", "r3", "r4"]


async def test_a_room_still_playing_waits_for_rooms_about_to_run_out() -> None:
    q = JobQueue(maxsize=4, backlog=16)
    buffered = {"playing": 3000.0, "ending": URGENT_MS - 1, "longer": 5000.0}
    q.buffered_ms = lambda room: buffered.get(room, 0.0)
    for room in ("longer", "playing", "ending", "quiet"):
        q.put_nowait(utt(room, 2 if room != "quiet" else 1))
    # Under a second left (or nothing at all) is equally urgent, in turn; then by time left.
    assert drain(q) == ["ending2", "quiet1", "playing2", "longer2"]


async def test_bounds_first_lines_against_maxsize_later_lines_against_backlog() -> None:
    q = JobQueue(maxsize=2, backlog=3)
    assert q.room() == 2
    q.put_nowait(utt("a", 1))
    q.put_nowait(utt("a", 2))
    q.put_nowait(utt("a", 3))
    assert (q.ready(), q.held(), q.room()) == (1, 2, 1)
    q.put_nowait(utt("b", 1))
    assert q.room() == 0 and not q.fits(utt("c", 1)) and q.fits(utt("a", 4))
    with pytest.raises(asyncio.QueueFull):
        q.put_nowait(utt("c", 1))
    q.put_nowait(utt("b", 2))
    with pytest.raises(asyncio.QueueFull):
        q.put_nowait(utt("a", 4))
    assert q.qsize() == 5
    assert drain(q) == ["a1", "b1", "a2", "b2", "a3"]


async def test_adopted_and_returned_jobs_go_first() -> None:
    q = JobQueue(maxsize=2, backlog=1)
    q.put_nowait(utt("a", 1))
    q.put_nowait(utt("a", 2))
    taken = q.get_nowait()
    q.put_nowait(utt("b", 1))
    adopted = utt("z", 1)
    adopted.adopted = True
    q.put_first(adopted)  # past every bound
    q.put_back(taken)
    assert drain(q) == ["z1", "a1", "a2", "b1"]


async def test_fifo_mode_keeps_the_old_order_and_bound() -> None:
    q = JobQueue(maxsize=3, backlog=16, fair=False)
    for seq in (1, 2):
        q.put_nowait(utt("F", seq))
    q.put_nowait(utt("a", 1))
    assert q.room() == 0 and not q.fits(utt("F", 3))
    assert drain(q) == ["F1", "F2", "a1"]


async def test_get_waits_for_a_job() -> None:
    q = JobQueue(maxsize=2)
    getter = asyncio.create_task(q.get())
    await asyncio.sleep(0.05)
    assert not getter.done()
    q.put_nowait(utt("a", 1))
    assert (await asyncio.wait_for(getter, 5)).job.room == "a"
