"""A Redis Cluster reached by ``rediss://`` (docs/cluster.md): TLS only (no plain port), the
cluster bus and replication over TLS, every client showing a certificate of the test CA.

- The per-node autopipeline (``voxroom/store/cluster/pipeline.py``) opens its nodes with the cluster
  client's TLS options (CA, client certificate): its commands answer, raw as on a plain node, and
  a ``MOVED`` is followed (error replies keep their whole text over TLS:
  tests/reliability/test_redis_tls.py).
- A gateway and a worker, each with ``REDIS_URL`` naming a different node, speak lines to a
  listener in rooms on every primary, each heard whole, once, in order; the gateway answers
  ``accepted`` only once a replica confirmed the line (``VOXROOM_REDIS_WAIT_REPLICAS=1``: the
  ``WAIT`` after an accept on a node's TLS pipeline).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from redis.crc import key_slot

from tests.support.cluster import TlsRedisClusterProcs, replicas_streaming, tls_cluster
from tests.support.processes import Proc, start_gateway, start_worker
from tests.support.room_client import RoomClient
from voxroom.store import keys
from voxroom.store.clients import cluster_from_url
from voxroom.store.cluster.pipeline import ClusterAutoPipeline

LINES = 2


@pytest.fixture(scope="module")
def tls() -> Iterator[TlsRedisClusterProcs]:
    with tls_cluster() as cluster:
        replicas_streaming(cluster)  # the first say's WAIT must not time out on a new replica
        yield cluster


async def test_autopipeline_over_tls(tls: TlsRedisClusterProcs) -> None:
    cluster: Any = await cluster_from_url(tls.url, decode_responses=True)  # get_node_from_key: untyped
    pipes = ClusterAutoPipeline(cluster)
    try:
        keys_ = [f"vx:test:{{tls-{i}}}" for i in range(24)]
        assert len({cluster.get_node_from_key(k).name for k in keys_}) == 3
        assert await asyncio.gather(*(pipes.call("SET", k, i) for i, k in enumerate(keys_))) == ["OK"] * 24
        # Raw replies, as the plain single connection gives them (no redis-py callbacks).
        assert await pipes.group([("GET", keys_[0]), ("EXPIRE", keys_[0], 60)]) == ["0", 1]
        await pipes.call("HSET", keys_[2] + ":h", "a", "1", "b", "2")
        assert await pipes.call("HGETALL", keys_[2] + ":h") == ["a", "1", "b", "2"]
        pipe = await pipes.pipe_for(keys_[0])  # the client certificate the URL names
        assert tls.tls is not None and pipe.redis.connection_pool.connection_kwargs["ssl_certfile"] == str(tls.tls.cert)

        # A stale slot map: the slot pointed at another primary, which answers MOVED.
        slot = key_slot(keys_[1].encode())
        owner = cluster.get_node_from_key(keys_[1])
        wrong = next(n for n in cluster.get_primaries() if n.name != owner.name)
        cluster.nodes_manager.slots_cache[slot] = [wrong]
        redirects = pipes.reads.redirects
        assert await pipes.call("GET", keys_[1]) == "1"
        assert pipes.reads.redirects == redirects + 1
        assert cluster.get_node_from_key(keys_[1]).name == owner.name
        await pipes.group([("DEL", k) for k in [*keys_, keys_[2] + ":h"]])
    finally:
        await pipes.aclose()
        await cluster.aclose()


def _owned_slots(tls: TlsRedisClusterProcs) -> dict[int, set[int]]:
    """Primary port -> the slots it holds (``CLUSTER SLOTS``)."""
    owned: dict[int, set[int]] = {}
    with tls.nodes[0].client() as r:
        slots: Any = r.execute_command("CLUSTER", "SLOTS")
    for start, end, primary, *_ in slots:
        owned.setdefault(int(primary[1]), set()).update(range(int(start), int(end) + 1))
    return owned


def _key_in(slots: set[int], pattern: str) -> str:
    """The first ``pattern % i`` whose slot is one of ``slots``."""
    return next(k for k in (pattern % i for i in range(100_000)) if key_slot(k.encode()) in slots)


def _rooms_on_every_primary(tls: TlsRedisClusterProcs) -> list[str]:
    # A room's keys carry its id as their hash tag: the room's slot is the id's.
    tag = uuid.uuid4().hex[:6]
    rooms = [_key_in(slots, f"tls-{tag}-%d") for slots in _owned_slots(tls).values()]
    assert all(key_slot(keys.room_state(r).encode()) == key_slot(r.encode()) for r in rooms)
    return rooms


async def test_gateway_and_worker_speak_over_tls(tls: TlsRedisClusterProcs,
                                                 tmp_path_factory: pytest.TempPathFactory) -> None:
    logs = tmp_path_factory.mktemp("tls-cluster")
    procs: list[Proc] = []
    try:
        gateway, port = start_gateway(tls.nodes[0].url, logs, VOXROOM_REDIS_WAIT_REPLICAS="1",
                                      VOXROOM_REDIS_WAIT_TIMEOUT_MS="2000")
        procs.append(gateway)
        procs.append(start_worker(tls.nodes[1].url, logs, engine="synthetic", name="tls-worker"))
        rooms = _rooms_on_every_primary(tls)
        assert len(rooms) == 3

        async def one_room(room: str) -> RoomClient:
            async with RoomClient(port, room) as listener, RoomClient(port, room) as speaker:
                for n in range(LINES):
                    await speaker.say(f"Line {n + 1} over TLS in {room}.", voice="en-joe")
                await speaker.wait_for(lambda g: len(g.of("accepted")) + len(g.of("error")) >= LINES, 30)
                assert [m["seq"] for m in speaker.got.of("accepted")] == list(range(1, LINES + 1)), \
                    speaker.got.messages
                await listener.wait_ends(LINES, timeout=60)
                await asyncio.sleep(0.3)  # anything said twice would arrive by now
                return listener

        for listener in await asyncio.gather(*(one_room(r) for r in rooms)):
            ends = listener.got.ends()
            assert [e["utterance"] for e in ends] == list(range(1, LINES + 1)), ends
            assert all(e["status"] == "ok" for e in ends), ends
            starts = listener.got.of("start")
            assert [s["utterance"] for s in starts] == list(range(1, LINES + 1)), starts
            assert not any(s.get("restart") for s in starts), starts
            for utterance in range(1, LINES + 1):
                mine = listener.got.frames_of(utterance)
                assert [f.chunk for f in mine] == list(range(len(mine))) and mine, "chunks missing or doubled"
                assert mine[0].first and mine[-1].last
            assert [f.seq for f in listener.got.frames] == sorted(f.seq for f in listener.got.frames)
        for proc in procs:
            log = proc.log_text()
            assert proc.alive(), log[-3000:]
            assert "Traceback" not in log and "redis unavailable" not in log and "not confirmed" not in log, log[-3000:]
    finally:
        for proc in procs:
            proc.stop()

