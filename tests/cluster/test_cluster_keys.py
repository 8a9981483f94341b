"""Rooms keyed for Redis Cluster, on a real 3-primary, 3-replica cluster (tests/cluster/conftest.py).

What the first slice of docs/cluster.md promises: every key of a room lies in one slot (its id is
the hash tag), rooms spread over every primary, every script the gateway and the worker run
touches one room's slot besides the global keys, ``voxroom rooms`` / ``voxroom room ID`` read a
cluster from any one node. (That the gateway and the worker run on a cluster, end to end:
test_cluster_rooms.py.)
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster
from redis.exceptions import MovedError

from tests.support.cluster import RedisClusterProcs
from tests.support.processes import ROOT, base_env, start_gateway, start_worker
from tests.support.room_client import RoomClient
from voxroom.store import keys
from voxroom.store.clients import cluster_enabled
from voxroom.store.server import RedisServer, free_port

ROOM_SHAPES = ["a", "Z", "0", "-", "_", "werewolf-1", "village_2", "_api-" + "f" * 32, "x" * 64,
               "A-b_C-9", "9" * 64, "lobby", "--__--"]
"""Room ids of many shapes (``[A-Za-z0-9_-]{1,64}``), edge lengths and characters included."""

GLOBAL_KEYS = {keys.JOBS, keys.ROOMS, keys.WORKERS}


def room_keys(room: str) -> list[str]:
    return [keys.room_utterances(room), keys.room_output(room), keys.room_seq(room), keys.room_state(room),
            keys.room_senders(room), keys.room_opus_demand(room), keys.room_client_claim(room, "alice"),
            keys.room_client_claim(room, "c-" + "b" * 60)]


def keyslot(node: redis.Redis, key: str) -> int:
    conn: Any = node  # redis-py's execute_command is untyped
    return int(conn.execute_command("CLUSTER", "KEYSLOT", key))


@pytest.fixture(scope="module")
def cluster_client(redis_cluster: RedisClusterProcs) -> Iterator[RedisCluster]:
    with RedisCluster.from_url(redis_cluster.url, socket_timeout=5) as rc:
        yield rc


def test_every_key_of_a_room_lies_in_the_slot_of_its_id(redis_cluster: RedisClusterProcs) -> None:
    with redis_cluster.nodes[0].client() as node:
        for room in ROOM_SHAPES:
            slots = {key: keyslot(node, key) for key in room_keys(room)}
            assert set(slots.values()) == {keyslot(node, room)}, (room, slots)
            assert all(keys.room_of_key(key) == room for key in slots)


def test_rooms_spread_over_every_primary_and_a_room_is_whole_on_one(redis_cluster: RedisClusterProcs,
                                                                     cluster_client: RedisCluster) -> None:
    rooms = [f"spread-{i}" for i in range(30)]
    for room in rooms:
        for key in room_keys(room):
            cluster_client.set(key, room, ex=60)
    primaries = redis_cluster.primaries()
    assert len(primaries) == 3
    holders: dict[str, int] = {}
    for node in primaries:
        with node.client() as r:
            for room in rooms:
                # One multi-key command over all of the room's keys, on the node itself: Redis
                # answers CROSSSLOT unless they share a slot, and MOVED unless that slot is here.
                try:
                    found = int(r.exists(*room_keys(room)))
                except MovedError:
                    continue
                assert found == len(room_keys(room)), room
                holders[room] = node.port
    assert sorted(holders) == sorted(rooms), "every room is whole on exactly one primary"
    assert len(set(holders.values())) == 3, f"rooms on {len(set(holders.values()))} primaries of 3"
    for room in rooms:
        cluster_client.delete(*room_keys(room))


MONITOR_TOKEN = re.compile(r'"((?:[^"\\]|\\.)*)"')


def _evals(monitor_log: str) -> list[list[str]]:
    """The KEYS of every EVAL a client sent (not the commands the scripts ran: ``[0 lua]``)."""
    out = []
    for line in monitor_log.splitlines():
        if " lua]" in line:
            continue
        args = MONITOR_TOKEN.findall(line)
        if len(args) >= 3 and args[0].upper() in ("EVAL", "EVALSHA"):
            out.append(args[3:3 + int(args[2])])
    return out


async def test_every_script_touches_one_room_slot_besides_the_global_keys(
        redis_cluster: RedisClusterProcs, single_redis: RedisServer, tmp_path: Path) -> None:
    """The real scripts, as the real gateway and worker send them (captured with MONITOR on the
    single instance they run on today): say, publish, finish, the client id claim and release.
    Their keys, slotted by the real cluster, are one room's slot plus the global keys only."""
    worker = start_worker(single_redis.url, tmp_path, engine="synthetic")
    gateway, port = start_gateway(single_redis.url, tmp_path)
    monitor_log = tmp_path / "monitor.log"
    room = f"werewolf-{uuid.uuid4().hex[:6]}"
    with open(monitor_log, "wb") as out:
        monitor = subprocess.Popen(["redis-cli", "-p", str(single_redis.port), "monitor"], stdout=out,
                                   start_new_session=True)
        try:
            while b"OK" not in monitor_log.read_bytes():
                assert monitor.poll() is None, "redis-cli monitor exited"
                await asyncio.sleep(0.02)
            async with RoomClient(port, room, client="alice") as alice, RoomClient(port, room, client="bob") as bob:
                await alice.say("The night falls on the village.")
                await bob.say("Everybody closes their eyes.")
                ends = await alice.wait_ends(2)
                assert [e["status"] for e in ends] == ["ok", "ok"]
            await asyncio.sleep(0.3)  # the claims' release, after the sockets close
        finally:
            monitor.terminate()
            monitor.wait(10)
            gateway.stop()
            worker.stop()
    evals = [k for k in _evals(monitor_log.read_text(errors="replace")) if any(room in key for key in k)]
    assert evals, "no script mentioned the room"
    with redis_cluster.nodes[0].client() as node:
        room_slot = keyslot(node, room)
        for script_keys in evals:
            mine = [key for key in script_keys if key not in GLOBAL_KEYS]
            assert mine, script_keys
            assert all(keys.room_of_key(key) == room for key in mine), script_keys
            assert {keyslot(node, key) for key in mine} == {room_slot}, script_keys
    seen = {key.rsplit(":", 1)[-1] if ":client:" not in key else "client" for k in evals for key in k}
    # say (senders, seq, utt, state, out + jobs, rooms), publish/finish (jobs, out, state), claims.
    assert {"senders", "seq", "utt", "state", "out", "client", "jobs", "rooms"} <= seen, seen


def _write_room(rc: RedisCluster, room: str, text: str) -> None:
    """A room as the say script and a worker leave it (the fields voxroom rooms reads)."""
    now_ms = int(time.time() * 1000)
    rc.zadd(keys.rooms_shard(keys.shard_of(room, 12), 12), {room: now_ms})  # the index shard, as the gateway
    rc.set(keys.room_seq(room), 1, ex=600)
    rc.hset(keys.room_state(room), mapping={"next": 2, "end_ms": now_ms, "voice": "en-joe"})
    rc.expire(keys.room_state(room), 600)
    rc.xadd(keys.room_utterances(room), {"seq": 1, "text": text, "voice": "en-joe", "sender": "alice",
                                         "client_seq": 1, "time": now_ms})
    rc.expire(keys.room_utterances(room), 600)
    rc.xadd(keys.room_output(room), {"kind": "end", "seq": 1, "status": "ok"})
    rc.expire(keys.room_output(room), 600)


def _cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "voxroom_cli", *args, "--redis-url", url], cwd=ROOT,
                          env=base_env(url), capture_output=True, text=True, timeout=60, check=False)


def test_rooms_cli_reads_a_cluster_from_any_one_node(redis_cluster: RedisClusterProcs,
                                                     cluster_client: RedisCluster) -> None:
    room = f"cli-{uuid.uuid4().hex[:6]}"
    _write_room(cluster_client, room, "The seer wakes up.")
    rc: Any = cluster_client  # redis-py's get_node_from_key is untyped
    slot_owner = rc.get_node_from_key(keys.room_state(room))
    assert slot_owner is not None
    # Ask a node that does not hold the room: the CLI must find the others itself.
    elsewhere = next(n for n in redis_cluster.nodes if n.port != slot_owner.port)
    assert cluster_enabled(elsewhere.url) is True

    listing = _cli(elsewhere.url, "rooms")
    assert listing.returncode == 0, listing.stderr
    row = next(line for line in listing.stdout.splitlines() if line.startswith(room))
    cols = row.split()  # room, idle s, last seq, next, waiting, backlog ms, voice, ...
    assert (cols[0], cols[2], cols[3], cols[6]) == (room, "1", "2", "en-joe"), row
    assert "job group" in listing.stdout  # the job shards' groups, or none yet (test order)

    one = _cli(elsewhere.url, "room", room)
    assert one.returncode == 0, one.stderr
    assert "The seer wakes up." in one.stdout
    assert "alice" in one.stdout
    assert "no pending job for this room" in one.stdout

    gone = _cli(elsewhere.url, "room", "never-spoke")
    assert gone.returncode == 1
    assert "has nothing in Redis" in gone.stdout


def test_a_single_instance_is_not_a_cluster(single_redis: RedisServer) -> None:
    assert cluster_enabled(single_redis.url) is False
    assert cluster_enabled(f"redis://127.0.0.1:{free_port()}/0") is None  # nobody there: start as before
