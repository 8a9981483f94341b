"""``cancel`` on the real 3+3 Redis Cluster (issue 30): the same store interface as on one Redis,
its Cluster implementation. Rooms whose slots lie on each of the three primaries, a speaker on one
gateway and a listener on the other (each given a different node), one synthetic worker: a
playing line cut for both listeners at the same slice, the queued lines behind it never started,
and the room speaking again right after; and a queued line cancelled by its say ``seq``. Private
lines (the other half of the game master's controls) on the same rooms.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from redis.cluster import RedisCluster

from tests.support.cluster import RedisClusterProcs
from tests.support.cuts import assert_cut, assert_whole, cancel, ends_of
from tests.support.processes import Proc, start_gateway, start_worker
from tests.support.room_client import RoomClient
from voxroom.store import keys

LONG = "The night is long and the village sleeps while the wolves choose their victim in silence. " * 2
SHORT = "Wake up, village."


@pytest.fixture(scope="module")
def gateways(redis_cluster: RedisClusterProcs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[int]]:
    logs = tmp_path_factory.mktemp("cluster-cancel")
    nodes = redis_cluster.nodes
    procs: list[Proc] = []
    try:
        ports = []
        for node in nodes[:2]:
            proc, port = start_gateway(node.url, logs)
            procs.append(proc)
            ports.append(port)
        procs.append(start_worker(nodes[3].url, logs, engine="synthetic", name="cancel-worker"))
        yield ports
    finally:
        for proc in procs:
            proc.stop()


def _room_per_primary(redis_cluster: RedisClusterProcs) -> list[str]:
    tag = uuid.uuid4().hex[:6]
    found: dict[int, str] = {}
    with RedisCluster.from_url(redis_cluster.url, socket_timeout=5) as rc:
        routed: Any = rc  # redis-py's get_node_from_key is untyped
        i = 0
        while len(found) < len(redis_cluster.primaries()):
            room = f"cut-{tag}-{i}"
            i += 1
            found.setdefault(int(routed.get_node_from_key(keys.room_state(room)).port), room)
    return list(found.values())


async def _clear_a_playing_room(ports: list[int], room: str) -> None:
    a, b = ports
    async with RoomClient(a, room) as speaker, RoomClient(b, room) as listener:
        await speaker.say(LONG)
        await speaker.say("Queued behind the long line.")
        await speaker.say("Queued too.")
        await speaker.wait_for(lambda g: len(g.of("accepted")) == 3, 30)
        await listener.wait_for(lambda g: len(g.frames_of(1)) >= 10, 60)
        assert await cancel(speaker, all=True) == {"type": "cancelled", "utterances": [1, 2, 3]}
        await listener.wait_ends(1, timeout=30)
        await speaker.say(SHORT)
        await listener.wait_for(lambda g: bool(ends_of(g, 4)), 60)
        await speaker.wait_for(lambda g: bool(ends_of(g, 4)), 30)
        await asyncio.sleep(0.3)
        cut = assert_cut(listener.got, 1)
        assert assert_cut(speaker.got, 1) == cut, "both gateways' listeners stop at the same slice"
        assert [s["utterance"] for s in listener.got.of("start")] == [1, 4], "the queued lines never start"
        assert_whole(listener.got, 4)


async def test_cancel_all_on_rooms_of_every_primary(gateways: list[int], redis_cluster: RedisClusterProcs) -> None:
    rooms = _room_per_primary(redis_cluster)
    assert len(rooms) == 3
    await asyncio.gather(*(_clear_a_playing_room(gateways, room) for room in rooms))


async def test_a_queued_line_cancelled_by_its_seq(gateways: list[int], redis_cluster: RedisClusterProcs) -> None:
    a, b = gateways
    room = _room_per_primary(redis_cluster)[0]
    async with RoomClient(a, room) as speaker, RoomClient(b, room) as listener:
        await speaker.say(SHORT, seq=7)
        await speaker.say("Never heard.", seq=8)
        await speaker.say("The seer wakes.", seq=9)
        await speaker.wait_for(lambda g: len(g.of("accepted")) == 3, 30)
        assert await cancel(speaker, seq=8) == {"type": "cancelled", "utterances": [2]}
        await listener.wait_for(lambda g: [e["utterance"] for e in g.ends()] == [1, 3], 60)
        await asyncio.sleep(0.3)
        assert [s["utterance"] for s in listener.got.of("start")] == [1, 3]
        assert listener.got.frames_of(2) == []
        assert_whole(listener.got, 1)
        assert_whole(listener.got, 3)


async def _a_private_line(ports: list[int], room: str) -> None:
    a, b = ports
    secret = "Your pack is the miller and the baker."
    async with (RoomClient(a, room, client="gm") as gm, RoomClient(b, room, client="wolf") as wolf,
                RoomClient(a, room, client="v1") as v1, RoomClient(b, room, client="v2") as v2):
        await gm.say(SHORT)
        await gm.say(secret, to=["wolf"])
        await gm.say("The village wakes.")
        for client in (gm, wolf, v1, v2):
            await client.wait_for(lambda g: bool(ends_of(g, 3)), 60)
        await asyncio.sleep(0.3)
        for insider in (gm, wolf):
            assert [s["utterance"] for s in insider.got.of("start")] == [1, 2, 3]
            assert_whole(insider.got, 2)
        for outsider in (v1, v2):
            assert [s["utterance"] for s in outsider.got.of("start")] == [1, 3]
            assert outsider.got.frames_of(2) == [] and "miller" not in str(outsider.got.messages)
    # A replay from Redis after the fact: the same filter.
    async with RoomClient(b, room, client="late", resume="1.end") as late:
        await late.wait_for(lambda g: bool(ends_of(g, 3)), 30)
        assert [s["utterance"] for s in late.got.of("start")] == [3] and late.got.frames_of(2) == []


async def test_a_private_line_on_rooms_of_every_primary(gateways: list[int], redis_cluster: RedisClusterProcs) -> None:
    """Private lines (``say`` with ``to``) in Cluster mode: the audience and the sender get the line
    whole, the others on both gateways nothing of it, live and in a ``?resume=`` replay."""
    await asyncio.gather(*(_a_private_line(gateways, room) for room in _room_per_primary(redis_cluster)))
