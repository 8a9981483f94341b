"""The gateway's fan-out on a real Redis Cluster reads rooms when their sharded pub/sub bell rings
(docs/cluster.md, "Gateway fan-out"): a few connections per node, whatever the number of rooms.

- A gateway process with 24 rooms over the 3 primaries (a listener in each, a synthetic worker
  speaking a line in every room): every line heard whole, once, in order; the gateway's TCP
  connections to each primary (counted from its own sockets, psutil) stay at a few, one of them
  the ``vx-gw-bells`` subscriber (``CLIENT LIST``). The per-room blocked reads held one per room:
  8 on each primary here.
- A bell rung before the hub subscribed (nobody heard it: ``SPUBLISH`` counted 0 receivers) is
  covered by the read that follows the subscribe; the 2 s sweep is turned off for that test, so
  nothing else could have read the room.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
import redis
from redis.cluster import RedisCluster

from tests.cluster.test_cluster_reads import _hub, _listener, _pipe, _received, _rooms_on_every_primary, _wait_for
from tests.support.cluster import RedisClusterProcs
from tests.support.heard import assert_heard_whole_once_in_order
from tests.support.processes import Proc, start_gateway, start_worker
from tests.support.room_client import RoomClient
from tests.support.waiting import until
from voxroom.store import keys
from voxroom.store.cluster.bells import CLIENT_NAME
from voxroom.store.cluster.sweeper import SWEEP_EVERY_S

ROOMS_PER_PRIMARY = 8
NEW_CONNECTIONS_PER_NODE_MAX = 3
"""Opened to a node by the gateway once its rooms joined and spoke: the bells' subscriber, the
hub's pipeline (joins, reads), the hand-off's pipeline (``say``): independent of the number of
rooms. Besides them the gateway holds what it opened at start (the slot map's, the directory's)."""

RING_XADD = """
local id = redis.call('XADD', KEYS[1], '*', 'frame', ARGV[1])
return {id, redis.call('SPUBLISH', ARGV[2], '')}
"""


@pytest.fixture(scope="module")
def gateway_and_worker(redis_cluster: RedisClusterProcs,
                       tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proc, int]]:
    logs = tmp_path_factory.mktemp("cluster-bells")
    procs: list[Proc] = []
    try:
        gateway, port = start_gateway(redis_cluster.nodes[0].url, logs)
        procs.append(gateway)
        procs.append(start_worker(redis_cluster.nodes[1].url, logs, engine="synthetic", name="worker",
                                  VOXROOM_CONTEXT_QUEUE="8"))
        yield gateway, port
    finally:
        for proc in procs:
            proc.stop()


def _connections_to(pid: int, port: int) -> int:
    return sum(1 for c in psutil.Process(pid).net_connections(kind="tcp")
               if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED)


async def _settled(pid: int, primaries: list[int]) -> dict[int, int] | None:
    """The gateway's connections per node when they held still for two sweeps, else ``None``."""
    first = {p: _connections_to(pid, p) for p in primaries}
    await asyncio.sleep(2 * SWEEP_EVERY_S + 0.2)
    again = {p: _connections_to(pid, p) for p in primaries}
    return again if again == first and all(again.values()) else None


def _last_commands(pid: int, node_port: int) -> list[str]:
    """Each of the gateway's connections to the node as ``name:last command:age s`` (for a failure)."""
    mine = {c.laddr.port for c in psutil.Process(pid).net_connections(kind="tcp")
            if c.raddr and c.raddr.port == node_port}
    with redis.Redis(port=node_port, socket_timeout=5, decode_responses=True) as r:
        return [f"{c['name']}:{c['cmd']}:{c['age']}" for c in r.client_list()
                if int(c["addr"].rsplit(":", 1)[1]) in mine]


def _bell_clients(node_port: int, gateway_pid: int) -> int:
    """``vx-gw-bells`` clients of the gateway on the node (matched by the gateway's local ports)."""
    mine = {c.laddr.port for c in psutil.Process(gateway_pid).net_connections(kind="tcp")
            if c.raddr and c.raddr.port == node_port}
    with redis.Redis(port=node_port, socket_timeout=5, decode_responses=True) as r:
        clients = r.client_list()
    return sum(1 for c in clients if c["name"] == CLIENT_NAME and int(c["addr"].rsplit(":", 1)[1]) in mine)


@pytest.mark.timeout(180)
async def test_a_gateway_with_24_rooms_holds_a_few_connections_per_node(
        redis_cluster: RedisClusterProcs, gateway_and_worker: tuple[Proc, int]) -> None:
    gateway, port = gateway_and_worker
    primaries = [n.port for n in redis_cluster.primaries()]
    rooms = _rooms_on_every_primary(redis_cluster, per_node=ROOMS_PER_PRIMARY)
    assert len(rooms) == 3 * ROOMS_PER_PRIMARY
    # What the gateway opens by itself first (its sweeper's reads of every index shard, its
    # directory's of every heartbeat): settled once the counts hold still over two sweeps.
    before = await until(lambda: _settled(gateway.pid, primaries), "the gateway's own connections", timeout=30)
    async with contextlib.AsyncExitStack() as stack:
        listeners = [await stack.enter_async_context(RoomClient(port, room)) for room in rooms]
        speakers = [await stack.enter_async_context(RoomClient(port, room)) for room in rooms]
        await asyncio.gather(*(s.say(f"A line in room number {i}.", voice="en-joe") for i, s in enumerate(speakers)))
        await asyncio.gather(*(c.wait_ends(1, timeout=90) for c in listeners))
        await asyncio.sleep(0.3)  # anything sent twice would have arrived by now
        for client in listeners:
            assert_heard_whole_once_in_order(client.got, 1)
        # Every room is held now (48 clients): the connections per node do not follow the rooms.
        opened = {p: _connections_to(gateway.pid, p) - before[p] for p in primaries}
        assert all(n <= NEW_CONNECTIONS_PER_NODE_MAX for n in opened.values()), (
            before, opened, {p: _last_commands(gateway.pid, p) for p in primaries})
        assert {p: _bell_clients(p, gateway.pid) for p in primaries} == {p: 1 for p in primaries}
    assert gateway.alive(), gateway.log_text()[-3000:]
    log = gateway.log_text()
    assert "Traceback" not in log, log[-3000:]


async def test_a_bell_rung_before_the_subscribe_is_covered_by_the_read_after_it(
        redis_cluster: RedisClusterProcs) -> None:
    room = _rooms_on_every_primary(redis_cluster, per_node=1)[0]
    async with _hub(redis_cluster.url) as (hub, fanout), _pipe(redis_cluster.url) as pipe:
        fanout.sweep_s = 3600.0  # no sweep: only a bell or the read after the subscribe reads
        listener = _listener(room)
        await hub.join(listener)
        # Joined (its cursor is the tail), not subscribed yet: the subscriber connection opens
        # in the node's loop, which has not run. This entry's bell reaches nobody.
        _entry, receivers = await pipe.call("EVAL", RING_XADD, 1, keys.room_output(room), b"early",
                                            keys.room_bell(room))
        assert receivers == 0
        await _wait_for("the early entry", lambda: _received(listener) == [b"early"])
        # And a bell rung once subscribed is heard: the room's own next entry.
        _entry, receivers = await pipe.call("EVAL", RING_XADD, 1, keys.room_output(room), b"late",
                                            keys.room_bell(room))
        assert receivers == 1
        await _wait_for("the late entry", lambda: _received(listener) == [b"early", b"late"])
        await hub.leave(listener)
        assert fanout.bells.held() == 0 and not fanout._reading  # nothing kept for the room


async def test_a_room_joining_a_node_whose_rooms_all_left_is_subscribed_again(
        redis_cluster: RedisClusterProcs) -> None:
    """Once the last room of a node leaves, the node's loop waits for the next room. It used to
    wait for good: a join sent nothing and woke nothing while the node had no connection, so the
    new room's bell was never subscribed and the room was heard only at the 2 s sweeps (bursts of
    two seconds of audio, more than a listener's queue holds: found by the Cluster test of
    private lines). The sweep is off here: only bells read."""
    rooms = _rooms_on_every_primary(redis_cluster, per_node=2)
    with RedisCluster.from_url(redis_cluster.url, socket_timeout=5) as rc:
        routed: Any = rc  # redis-py's get_node_from_key is untyped
        node_of = {room: int(routed.get_node_from_key(keys.room_output(room)).port) for room in rooms}
    first = rooms[0]
    second = next(room for room in rooms[1:] if node_of[room] == node_of[first])
    port = node_of[first]
    async with _hub(redis_cluster.url) as (hub, fanout), _pipe(redis_cluster.url) as pipe:
        fanout.sweep_s = 3600.0
        for n, room in enumerate((first, second)):
            listener = _listener(room)
            await hub.join(listener)
            await until(lambda room=room: _subscribers(port, room) == 1, f"room {n}'s bell subscribed", timeout=10)
            _entry, receivers = await pipe.call("EVAL", RING_XADD, 1, keys.room_output(room), b"ding",
                                                keys.room_bell(room))
            assert receivers == 1, f"room {n}: its bell reaches the gateway"
            await _wait_for(f"room {n}'s entry", lambda listener=listener: _received(listener) == [b"ding"])
            await hub.leave(listener)  # the node's only room leaves: its loop waits for the next
            assert fanout.bells.held() == 0
            await until(lambda: not any(node.connected for node in fanout.bells._nodes.values()),
                        "the node's subscriber connection closed", timeout=10)


def _subscribers(port: int, room: str) -> int:
    with redis.Redis(port=port, socket_timeout=5) as r:
        numsub: Any = r.execute_command("PUBSUB", "SHARDNUMSUB", keys.room_bell(room))
    return int(numsub[1])


def test_the_bell_channel_is_the_output_key_with_bell_for_out() -> None:
    # voxroom/store/cluster/jobs.py's Lua derives the channel from the output key this way.
    for room in ("a", "lobby-1", "X_y-9"):
        assert keys.room_bell(room) == keys.room_output(room)[:-3] + "bell"
