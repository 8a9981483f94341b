"""A line's writes are fenced by the room's turn as well as by job ownership (voxroom/store/jobs.py): a
line that passed its turn check, and was then skipped past by a later line, has its next publish
and its end refused by Redis, atomically, and nothing of it lands in the room's output after the
skip; the other rooms' jobs in the same batched script still publish. Against a real redis-server,
the bus alone and the real publisher (paced, unpaced as private speech API rooms are, restart)."""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any

import numpy as np
import pytest
from redis.asyncio import Redis

from tests.support.stores import Stores
from voxroom.errors import OwnershipLost, TurnLost
from voxroom.store import keys
from voxroom.store.interface import Turn
from voxroom.store.jobs import FencedJobBus
from voxroom.wire.jobs import Job
from voxroom.wire.protocol import SLICE_MS, SLICE_SAMPLES
from workers.output.clock import RoomClock
from workers.output.publisher import publish_utterance
from workers.utterance import SliceBuffer, Utterance

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


async def _eval_calls(r: Redis) -> int:
    stats: dict[str, Any] = await r.info("commandstats")
    return int(stats.get("cmdstat_eval", {}).get("calls", 0))


async def _kinds(raw: Redis, room: str) -> list[tuple[str, str, str | None]]:
    """(kind, seq, chunk) of every entry of the room's output, in order (read raw: audio)."""
    entries: Any = await raw.xrange(keys.room_output(room))
    return [(f[b"kind"].decode(), f[b"seq"].decode(), f[b"chunk"].decode() if b"chunk" in f else None)
            for _, f in entries]


def _chunks(seq: int, first: int, n: int) -> list[dict[Any, Any]]:
    return [{"kind": "chunk", "seq": seq, "chunk": c, "frame": f"frame-{c}".encode()} for c in range(first, first + n)]


async def test_a_skipped_job_fails_alone_in_the_batched_script(r: Redis, raw: Redis, stores: Stores) -> None:
    bus = await stores.bus(r, "w-turn")
    try:
        rooms = ["turn-a", "turn-b", "turn-c"]
        a, b, c = [await _take(r, bus, room, 1) for room in rooms]
        await asyncio.gather(*(bus.publish(job, [{"kind": "start", "seq": 1}, *_chunks(1, 0, 1)], started=1)
                               for job in (a, b, c)))
        # Line 2 of room b skips past line 1 (as ``skip_to`` does), which is still b's job.
        await r.hset(keys.room_state("turn-b"), "next", 2)

        before = await _eval_calls(r)
        results = await asyncio.gather(
            *(bus.publish(job, [*_chunks(1, 1, 2), {"kind": "marks", "seq": 1, "marks": "[]"}]) for job in (a, b, c)),
            return_exceptions=True)
        assert await _eval_calls(r) - before == 1, "still one script for every room"
        assert results[0] is None and results[2] is None
        assert isinstance(results[1], TurnLost)
        assert isinstance(results[1], OwnershipLost), "anything else that sees it stops writing"
        for room in ("turn-a", "turn-c"):
            assert await _kinds(raw, room) == [("start", "1", None), ("chunk", "1", "0"), ("chunk", "1", "1"),
                                             ("chunk", "1", "2"), ("marks", "1", None)]
        assert await _kinds(raw, "turn-b") == [("start", "1", None), ("chunk", "1", "0")]

        # Its end is refused too: no end entry, next neither rewound nor moved, the job still
        # pending (the publisher drops the line as stale and acks it).
        with pytest.raises(TurnLost):
            await bus.finish(b, {"kind": "end", "seq": 1, "chunks": 1}, 1000.0)
        assert await _kinds(raw, "turn-b") == [("start", "1", None), ("chunk", "1", "0")]
        assert await r.hget(keys.room_state("turn-b"), "next") == "2"
        assert await r.hget(keys.room_state("turn-b"), "end_ms") is None
        assert await r.xpending(keys.JOBS, keys.JOBS_GROUP) and await bus.ack(b)

        # The others end as always, and hand the turn on.
        await bus.finish(a, {"kind": "end", "seq": 1, "chunks": 3}, 1000.0)
        assert (await _kinds(raw, "turn-a"))[-1] == ("end", "1", None)
        assert await r.hget(keys.room_state("turn-a"), "next") == "2"
    finally:
        await bus.close()


async def test_a_job_whose_room_moved_past_it_before_its_first_publish_writes_nothing(r: Redis, raw: Redis, stores: Stores) -> None:
    bus = await stores.bus(r, "w-turn-first")
    try:
        job = await _take(r, bus, "turn-first", 2)
        await r.hset(keys.room_state("turn-first"), "next", 3)
        with pytest.raises(TurnLost):
            await bus.publish(job, [{"kind": "start", "seq": 2}, *_chunks(2, 0, 1)], started=2)
        assert await r.exists(keys.room_output("turn-first")) == 0
        assert await r.hget(keys.room_state("turn-first"), "started") is None
        # A room whose ``next`` is missing is at 1, as ``wait_for_turn`` reads it.
        one = await _take(r, bus, "turn-fresh", 1)
        await bus.publish(one, [{"kind": "start", "seq": 1}], started=1)
        assert await _kinds(raw, "turn-fresh") == [("start", "1", None)]
    finally:
        await bus.close()


def _utterance(job: Job) -> Utterance:
    """A line whose engine has not given any audio yet (see :func:`_fill`)."""
    return Utterance(job=job, slices=SliceBuffer(asyncio.get_running_loop()))


def _fill(utt: Utterance, ms: float) -> None:
    utt.slices.extend([np.full(SLICE_SAMPLES, 1000 * utt.job.seq, dtype=np.int16)] * math.ceil(ms / SLICE_MS))
    utt.slices.close()


@pytest.mark.parametrize("mode", ["paced", "unpaced", "restart"])
async def test_a_line_skipped_past_after_its_turn_check_is_dropped_as_stale(
        r: Redis, raw: Redis, mode: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, stores: Stores) -> None:
    """Line 1 passes its turn check and waits for its engine's first slice; meanwhile line 2 (on
    another worker) skips past it. Before, line 1 then published its whole audio and its end into
    line 2's; now Redis refuses its first publish and the publisher drops it."""
    room = f"{keys.PRIVATE_ROOM_PREFIX}fence" if mode == "unpaced" else f"turn-race-{mode}"
    a, b = await stores.bus(r, "w-a"), await stores.bus(r, "w-b")
    try:
        first = _utterance(await _take(r, a, room, 1))
        second = _utterance(await _take(r, b, room, 2))
        if mode == "restart":
            await r.hset(keys.room_state(room), "started", 1)  # a dead worker had begun line 1
        checked = asyncio.Event()
        turns: list[Turn] = []
        room_turn = a.room_turn

        async def watched(name: str) -> Turn:
            turn = await room_turn(name)
            turns.append(turn)
            checked.set()
            return turn

        monkeypatch.setattr(a, "room_turn", watched)
        clock = RoomClock()
        publishing = asyncio.create_task(publish_utterance(a, first, clock, lead_ms=120, order_wait_ms=60_000,
                                                           voice_name="en-joe", paced=mode != "unpaced"))
        await asyncio.wait_for(checked.wait(), BOUND_S)
        assert turns[0].next == 1 and (turns[0].started == 1) == (mode == "restart")
        await b.skip_to(second.job)
        _fill(first, 200)

        caplog.set_level(logging.WARNING, logger="voxroom.worker.publisher")
        result = await asyncio.wait_for(publishing, BOUND_S)
        assert result.status == "skipped" and first.cancel.is_set()
        stale = [rec for rec in caplog.records if "skipped past it while it was to play" in rec.getMessage()]
        assert len(stale) == 1
        assert await r.exists(keys.room_output(room)) == 0, "nothing of line 1 landed"
        assert await a.ack(first.job), "still ours: the worker acks a stale line"

        _fill(second, 200)
        done = await asyncio.wait_for(publish_utterance(b, second, clock, lead_ms=120, order_wait_ms=60_000,
                                                        voice_name="en-joe", paced=mode != "unpaced"), BOUND_S)
        assert done.status == "ok"
        kinds = await _kinds(raw, room)
        assert {seq for _, seq, _ in kinds} == {"2"}
        assert kinds[0][0] == "start" and kinds[-1][0] == "end"
        assert await r.hget(keys.room_state(room), "next") == "3"
        assert (await r.xpending(keys.JOBS, keys.JOBS_GROUP))["pending"] == 0
    finally:
        await a.close()
        await b.close()
