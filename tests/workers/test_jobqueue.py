"""A context's job queue on its own: rooms in turn, a room's lines in seq order, the room that
runs out of audio soonest first, and every bound (``workers/pool/line_queue.py``)."""

from __future__ import annotations

import asyncio

import pytest

from voxroom.wire.jobs import Job
from workers.pool import line_queue as jobqueue
from workers.pool.line_queue import URGENT_MS, JobQueue
from workers.utterance import SliceBuffer, Utterance


def utt(room: str, seq: int) -> Utterance:
    job = Job(entry_id=f"{room}-{seq}", room=room, seq=seq, text="A line.", voice="en-joe",
              prev_voice="en-joe", sender="t", time_ms=0.0)
    return Utterance(job=job, slices=SliceBuffer(asyncio.get_running_loop()))


def drain_one(q: JobQueue) -> str:
    u = q.get_nowait()
    return f"{u.job.room}{u.job.seq}"


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


async def test_rooms_that_come_while_a_backlog_runs_wait_for_none_of_its_later_lines() -> None:
    # The flood's first line is taken before the other rooms' lines are read (fairness bench,
    # docs/benchmarks.md): then its audio runs low. Before, it stood first in the rotation and
    # its second line went ahead of every room still waiting for its first (two flood lines).
    q = JobQueue(maxsize=4, backlog=16)
    buffered = {"F": 0.0}
    q.buffered_ms = lambda room: buffered.get(room, 0.0)
    for seq in range(1, 5):
        q.put_nowait(utt("F", seq))
    assert drain_one(q) == "F1"
    buffered["F"] = URGENT_MS - 1  # its first line nearly played: as urgent as a silent room
    for room in ("a", "b"):
        q.put_nowait(utt(room, 1))
    assert drain_one(q) == "a1"
    q.put_nowait(utt("c", 1))  # read into the queue later still, while the flood waits
    assert [drain_one(q) for _ in range(3)] == ["b1", "c1", "F2"]
    q.put_nowait(utt("d", 1))  # came after F2 was taken: ahead of F3, not of anything older
    assert drain(q) == ["d1", "F3", "F4"]


async def test_a_room_behind_in_the_rotation_with_fewer_lines_taken_goes_first() -> None:
    q = JobQueue(maxsize=4, backlog=16)
    for seq in (1, 2, 3):
        q.put_nowait(utt("A", seq))
    assert drain_one(q) == "A1"
    q.put_nowait(utt("B", 1))
    q.put_nowait(utt("B", 2))
    # A (turn 1) stands before B (turn 0) in the rotation; B has had nothing yet.
    assert drain(q) == ["B1", "A2", "B2", "A3"]


async def test_a_room_whose_next_line_is_read_after_its_last_was_taken_keeps_its_turn() -> None:
    # The worker reads a flood a few lines at a time: its queue here may empty between them.
    q = JobQueue(maxsize=4, backlog=16)
    q.put_nowait(utt("F", 1))
    assert drain_one(q) == "F1"  # F's queue is empty now
    q.put_nowait(utt("a", 1))
    q.put_nowait(utt("F", 2))  # read after F1 was taken, ahead of b
    q.put_nowait(utt("b", 1))
    assert drain(q) == ["a1", "b1", "F2"]


async def test_the_turns_kept_for_rooms_that_emptied_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobqueue, "AFTER_MAX", 3)
    q = JobQueue(maxsize=4, backlog=16)
    for room in ("r0", "r1", "r2", "r3", "r4"):
        q.put_nowait(utt(room, 1))
        assert drain_one(q) == f"{room}1"
    assert sorted(q._after) == ["r2", "r3", "r4"]  # the oldest two forgotten
    q.put_nowait(utt("r4", 2))  # still remembered: it has had a line
    q.put_nowait(utt("r0", 2))  # forgotten: starts level with a room that has had none
    assert drain(q) == ["r02", "r42"]
    # r4's second line moved the clock to 1: every turn it passed is dropped.
    assert q._after == {"r4": 2}


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
    # a1 counts as a's turn however often it is put back: b, which has had none, before a2.
    assert drain(q) == ["z1", "a1", "b1", "a2"]


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
