"""The publishes of many rooms issued in one loop turn (a paced tick's slices) leave as one script
(voxroom/store/jobs.py), and each job is still fenced and fails on its own: a job another worker took,
a write Redis refuses, an argument that cannot be sent. Against a real redis-server."""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import DataError, ResponseError

from tests.support.stores import Stores
from voxroom.errors import OwnershipLost
from voxroom.store import keys
from voxroom.store.jobs import PUBLISH_BATCH_JOBS, FencedJobBus
from voxroom.wire.jobs import Job


async def _jobs(r: Redis, bus: FencedJobBus, rooms: list[str]) -> list[Job]:
    await bus.ensure_group()
    for room in rooms:
        await r.xadd(keys.JOBS, {"room": room, "seq": 1, "text": "x", "voice": "v", "prev_voice": "v", "time": 0})
    jobs = await bus.read_jobs(len(rooms), 100)
    assert [job.room for job in jobs] == rooms
    return jobs


async def _eval_calls(r: Redis) -> int:
    stats: dict[str, Any] = await r.info("commandstats")
    return int(stats.get("cmdstat_eval", {}).get("calls", 0))


def _chunks(seq: int, first: int, n: int) -> list[dict[Any, Any]]:
    return [{"kind": "chunk", "seq": seq, "chunk": c, "frame": f"frame-{c}".encode()} for c in range(first, first + n)]


async def test_one_loop_turn_of_publishes_is_one_script_each_room_in_order(r: Redis, stores: Stores) -> None:
    bus = await stores.bus(r, "w-batch")
    try:
        rooms = [f"batch-{i}" for i in range(10)]
        jobs = await _jobs(r, bus, rooms)
        before = await _eval_calls(r)
        # As a tick's publishers do: every room's publish issued in the same loop turn.
        await asyncio.gather(*(bus.publish(job, [{"kind": "start", "seq": 1}, *_chunks(1, 0, 2)], started=1)
                               for job in jobs))
        await asyncio.gather(*(bus.publish(job, _chunks(1, 2, 1)) for job in jobs))
        assert await _eval_calls(r) - before == 2, "one script per loop turn, not one per room"
        for room in rooms:
            entries: Any = await r.xrange(keys.room_output(room))
            assert [(e[1]["kind"], e[1].get("chunk")) for e in entries] == [
                ("start", None), ("chunk", "0"), ("chunk", "1"), ("chunk", "2")]
            assert await r.hget(keys.room_state(room), "started") == "1"
            assert await r.ttl(keys.room_output(room)) > 0
    finally:
        await bus.close()


async def test_more_rooms_than_a_script_takes_are_several_scripts(r: Redis, stores: Stores) -> None:
    bus = await stores.bus(r, "w-many")
    try:
        rooms = [f"many-{i}" for i in range(PUBLISH_BATCH_JOBS + 5)]
        jobs = await _jobs(r, bus, rooms)
        before = await _eval_calls(r)
        await asyncio.gather(*(bus.publish(job, _chunks(1, 0, 1)) for job in jobs))
        assert await _eval_calls(r) - before == 2
        for room in rooms:
            assert await r.xlen(keys.room_output(room)) == 1
    finally:
        await bus.close()


async def test_a_job_taken_by_another_worker_fails_alone(r: Redis, stores: Stores) -> None:
    bus = await stores.bus(r, "w-fence")
    try:
        rooms = ["fence-a", "fence-b", "fence-c"]
        a, b, c = await _jobs(r, bus, rooms)
        await r.xclaim(keys.JOBS, keys.JOBS_GROUP, "w-other", 0, [b.entry_id])  # b is no longer ours
        results = await asyncio.gather(*(bus.publish(job, _chunks(1, 0, 2)) for job in (a, b, c)),
                                       return_exceptions=True)
        assert results[0] is None and results[2] is None
        assert isinstance(results[1], OwnershipLost)
        assert await r.xlen(keys.room_output("fence-a")) == 2
        assert await r.exists(keys.room_output("fence-b")) == 0, "nothing of the lost job written"
        assert await r.xlen(keys.room_output("fence-c")) == 2
    finally:
        await bus.close()


async def test_a_write_redis_refuses_fails_only_its_job(r: Redis, stores: Stores) -> None:
    bus = await stores.bus(r, "w-wrongtype")
    try:
        a, b, c = await _jobs(r, bus, ["wt-a", "wt-b", "wt-c"])
        await r.set(keys.room_output("wt-b"), "not a stream")  # its XADD fails: WRONGTYPE
        results = await asyncio.gather(*(bus.publish(job, _chunks(1, 0, 1)) for job in (a, b, c)),
                                       return_exceptions=True)
        assert results[0] is None and results[2] is None
        assert isinstance(results[1], ResponseError) and "WRONGTYPE" in str(results[1])
        assert await r.xlen(keys.room_output("wt-a")) == 1
        assert await r.xlen(keys.room_output("wt-c")) == 1
    finally:
        await bus.close()


async def test_an_argument_that_cannot_be_sent_fails_only_its_job(r: Redis, stores: Stores) -> None:
    bus = await stores.bus(r, "w-surrogate")
    try:
        a, b = await _jobs(r, bus, ["sur-a", "sur-b"])
        results = await asyncio.gather(bus.publish(a, [{"kind": "start", "seq": 1, "text": "bad \udc80"}]),
                                       bus.publish(b, _chunks(1, 0, 1)), return_exceptions=True)
        assert isinstance(results[0], DataError)
        assert results[1] is None
        assert await r.exists(keys.room_output("sur-a")) == 0
        assert await r.xlen(keys.room_output("sur-b")) == 1
    finally:
        await bus.close()


async def test_a_lone_publish_goes_out_alone(r: Redis, stores: Stores) -> None:
    bus = await stores.bus(r, "w-lone")
    try:
        (job,) = await _jobs(r, bus, ["lone"])
        await bus.publish(job, _chunks(1, 0, 3))
        assert await r.xlen(keys.room_output("lone")) == 3
    finally:
        await bus.close()
