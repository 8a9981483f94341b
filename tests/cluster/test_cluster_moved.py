"""A ``MOVED`` that redis-py's ``RedisCluster.execute_command`` follows must not close other
commands' connections: with its default ``reinitialize_steps`` (5) every fifth ``MOVED`` calls
``RedisCluster.aclose()``, and the gateway hub's blocked room read on the same client failed
("Connection closed by server") in the middle of a reshard. ``voxroom.store.clients.cluster_client``
sets it to 0 (the slot named by the ``MOVED`` is re-pointed, nothing closed).

On the real 3+3 cluster: a room read blocked through ``ClusterReads`` (as the hub reads) while the
same client follows 8 ``MOVED`` replies (a stale slot map, made by pointing one slot at the wrong
primary before each command); then an entry is added and the blocked read returns it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from redis.crc import key_slot

from tests.support.cluster import RedisClusterProcs
from voxroom.store.clients import cluster_from_url
from voxroom.store.cluster.slots import ClusterReads

MOVES = 8
"""More than redis-py's default ``reinitialize_steps`` (5): the old client closed everything once."""


async def test_moved_keeps_a_blocked_read(redis_cluster: RedisClusterProcs) -> None:
    cluster: Any = await cluster_from_url(redis_cluster.url, decode_responses=True)  # get_node_from_key: untyped
    try:
        assert cluster.reinitialize_steps == 0
        primaries = cluster.get_primaries()
        room_key = "vx:room:{moved-read}:out"
        reader_node = cluster.get_node_from_key(room_key)
        assert reader_node is not None
        # A key on another primary, routed to a third one before each command: that node answers
        # MOVED (the slot is not its own) and redis-py follows it.
        other = next(k for k in (f"vx:moved:{{k{i}}}" for i in range(1000))
                     if cluster.get_node_from_key(k).name != reader_node.name)
        slot = key_slot(other.encode())
        owner = cluster.get_node_from_key(other)
        wrong = next(n for n in primaries if n.name not in (owner.name, reader_node.name))
        await cluster.set(other, "v")

        reads = ClusterReads(cluster)
        blocked = asyncio.create_task(reads.xread(room_key, "$", count=10, block_ms=8000), name="test:blocked-read")
        await asyncio.sleep(0.3)  # the XREAD is on the node, blocked
        assert not blocked.done()
        for _ in range(MOVES):
            cluster.nodes_manager.slots_cache[slot] = [wrong]
            assert await cluster.get(other) == "v"
        assert cluster.nodes_manager.slots_cache[slot][0].name == owner.name
        assert not blocked.done(), blocked  # a closed connection would have ended it with an error
        entry_id = await cluster.xadd(room_key, {"n": "1"})
        got = await asyncio.wait_for(blocked, 5)
        assert got == [[room_key, [(entry_id, {"n": "1"})]]] or got == [[room_key, [[entry_id, ["n", "1"]]]]], got
    finally:
        await cluster.delete("vx:room:{moved-read}:out")
        await cluster.aclose()
