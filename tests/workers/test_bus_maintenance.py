"""The worker's publishes trim the room's output stream and refresh its keys' TTLs on an
utterance's first publish and then once a second, not on every 40 ms publish (that cost about
2 ms of Redis CPU per line at 100 rooms); the end always does both. Against a real redis-server."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from tests.support.stores import Stores
from voxroom.store import jobs, keys
from voxroom.store.jobs import MAINTAIN_EVERY_S, FencedJobBus
from voxroom.wire.jobs import Job

TTL_S = 600


async def _owned_job(r: Redis, bus: FencedJobBus, room: str) -> Job:
    await bus.ensure_group()
    await r.xadd(keys.JOBS, {"room": room, "seq": 1, "text": "x", "voice": "v", "prev_voice": "v", "time": 0})
    jobs = await bus.read_jobs(1, 100)
    assert len(jobs) == 1
    return jobs[0]


async def test_publishes_refresh_the_room_once_a_second_and_the_end_always(
        r: Redis, stores: Stores, monkeypatch: pytest.MonkeyPatch) -> None:
    bus = await stores.bus(r, "w-1", room_idle_ttl_s=TTL_S)
    try:
        room = "maint-room"
        out = keys.room_output(room)
        job = await _owned_job(r, bus, room)
        # "Within the second" stretched to 30 while it is checked, so that a busy machine cannot
        # spread these few publishes past it.
        monkeypatch.setattr(jobs, "MAINTAIN_EVERY_S", 30.0)
        await bus.publish(job, [{"kind": "chunk", "seq": 1, "chunk": 0}])
        assert 0 < await r.ttl(out) <= TTL_S, "the first publish sets the TTL"
        # Someone shortens it (an operator, or a private room's gateway): publishes within the
        # second leave it alone...
        await r.expire(out, 5)
        for chunk in range(1, 6):
            await bus.publish(job, [{"kind": "chunk", "seq": 1, "chunk": chunk}])
        assert await r.ttl(out) <= 5
        # ...the first publish after it refreshes again,
        monkeypatch.setattr(jobs, "MAINTAIN_EVERY_S", MAINTAIN_EVERY_S)
        await asyncio.sleep(MAINTAIN_EVERY_S + 0.2)
        await bus.publish(job, [{"kind": "chunk", "seq": 1, "chunk": 6}])
        assert await r.ttl(out) > 5
        # and the end always does.
        await r.expire(out, 5)
        await r.expire(keys.room_state(room), 5)
        await bus.finish(job, {"kind": "end", "seq": 1, "chunks": 7}, 1000.0)
        assert await r.ttl(out) > 5 and await r.ttl(keys.room_state(room)) > 5
        entries = await r.xrange(out)
        assert [e[1]["kind"] for e in entries] == ["chunk"] * 7 + ["end"], "every entry written, in order"
        assert [int(e[1]["chunk"]) for e in entries[:7]] == list(range(7))
        assert bus._maintained == {}, "nothing kept for a finished job"
    finally:
        await bus.close()


async def test_a_new_utterance_maintains_on_its_first_publish(r: Redis, stores: Stores) -> None:
    bus = await stores.bus(r, "w-2", room_idle_ttl_s=TTL_S)
    try:
        first = await _owned_job(r, bus, "maint-a")
        await bus.publish(first, [{"kind": "chunk", "seq": 1, "chunk": 0}])
        second = await _owned_job(r, bus, "maint-b")
        await bus.publish(second, [{"kind": "start", "seq": 1}, {"kind": "chunk", "seq": 1, "chunk": 0}], started=1)
        assert 0 < await r.ttl(keys.room_output("maint-b")) <= TTL_S
        assert 0 < await r.ttl(keys.room_state("maint-b")) <= TTL_S
    finally:
        await bus.close()
