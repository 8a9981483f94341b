"""On Redis Cluster a line's room writes are fenced by the room's turn as well as by its owner
field (voxroom/store/cluster/jobs.py): a line a later line skipped past has its next publish and its end
refused in the room's slot, nothing of it lands after the skip, and a line of another room goes on.
On the real 3+3 cluster of conftest.py."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.support.cluster import RedisClusterProcs
from tests.support.stores import Stores
from voxroom.errors import OwnershipLost, TurnLost
from voxroom.store import keys
from voxroom.store.clients import cluster_client
from voxroom.store.cluster.calls import ClusterCalls
from voxroom.store.jobs import FencedJobBus
from voxroom.wire.jobs import Job

SHARDS = 12


@pytest.fixture
async def bus(redis_cluster: RedisClusterProcs, stores: Stores) -> FencedJobBus:
    made = await stores.bus(redis_cluster.url, f"turn-{uuid.uuid4().hex[:4]}", job_shards=SHARDS)
    await made.ensure_group()
    return made


@pytest.fixture
async def calls(redis_cluster: RedisClusterProcs) -> AsyncIterator[ClusterCalls]:
    """The test's own routed commands (replies parsed as redis-py parses them)."""
    made = ClusterCalls(cluster_client(redis_cluster.url, decode_responses=True))
    yield made
    await made.aclose()


async def _take_lines(bus: FencedJobBus, calls: ClusterCalls, rooms: list[str]) -> list[Job]:
    """Line 1 of each room in its job shard, read and taken by ``bus`` (earlier tests' jobs acked)."""
    while old := await bus.read_jobs(count=100, block_ms=50):
        for job in old:
            await bus.ack(job)
    for room in rooms:
        await calls.call("XADD", keys.job_shard(keys.shard_of(room, SHARDS), SHARDS), "*", "room", room, "seq", 1,
                               "text", "Line 1.", "voice", "en-joe", "prev_voice", "en-joe", "sender", "tester",
                               "time", 0)
    got: list[Job] = []
    for _ in range(50):
        got += await bus.read_jobs(count=5, block_ms=200)
        if len(got) >= len(rooms):
            break
    assert sorted(job.room for job in got) == sorted(rooms)
    return sorted(got, key=lambda job: rooms.index(job.room))


async def _kinds(calls: ClusterCalls, room: str) -> list[tuple[str, str]]:
    out: Any = await calls.call("XRANGE", keys.room_output(room), "-", "+")
    return [(f["kind"], f.get("chunk", "")) for _, f in out]


async def test_a_line_skipped_past_is_refused_in_its_rooms_slot(bus: FencedJobBus, calls: ClusterCalls) -> None:
    tag = uuid.uuid4().hex[:6]
    rooms = [f"turn-{tag}-a", f"turn-{tag}-b"]
    a, b = await _take_lines(bus, calls, rooms)
    for job in (a, b):
        await bus.publish(job, [{"kind": "start", "seq": 1}, {"kind": "chunk", "seq": 1, "chunk": 0}], started=1)
    # Line 2 of room b skips past line 1 (as ``skip_to`` does), which is still this worker's.
    await calls.call("HSET", keys.room_state(b.room), "next", 2)

    with pytest.raises(TurnLost) as refused:
        await bus.publish(b, [{"kind": "chunk", "seq": 1, "chunk": 1}, {"kind": "marks", "seq": 1, "words": "[]"}])
    assert isinstance(refused.value, OwnershipLost)
    await bus.publish(a, [{"kind": "chunk", "seq": 1, "chunk": 1}, {"kind": "marks", "seq": 1, "words": "[]"}])
    with pytest.raises(TurnLost):
        await bus.finish(b, {"kind": "end", "seq": 1, "chunks": 2}, 1000.0)
    await bus.finish(a, {"kind": "end", "seq": 1, "chunks": 2}, 1000.0)

    assert await _kinds(calls, a.room) == [("start", ""), ("chunk", "0"), ("chunk", "1"), ("marks", ""), ("end", "")]
    assert await _kinds(calls, b.room) == [("start", ""), ("chunk", "0")], "nothing of line 1 after the skip"
    state_b = await calls.call("HGETALL", keys.room_state(b.room))
    assert state_b["next"] == "2" and "end_ms" not in state_b
    assert (await calls.call("HGET", keys.room_state(a.room), "next")) == "2"
    # Still ours: the stale line is acked (its owner field released, its shard entry acked).
    assert await bus.ack(b)
    assert "owner:1" not in await calls.call("HGETALL", keys.room_state(b.room))
