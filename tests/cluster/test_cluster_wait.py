"""``VOXROOM_REDIS_WAIT_REPLICAS`` on the real 3+3 cluster: a room's line is answered ``accepted``
only once the replica of the room's primary holds it (the ``WAIT`` goes to the room's node, on
the connection of the accept); the replica paused (SIGSTOP) past the timeout: ``unavailable``, the
resend after SIGCONT is ``duplicate``, and the room hears each line once, in order.

The cluster is the package's shared one: the replica is SIGCONTed in a ``finally``, and paused for
less than the cluster's node timeout (5 s), so no node is ever marked failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from tests.support.cluster import ClusterNode, RedisClusterProcs, replicas_streaming
from tests.support.processes import start_gateway, start_worker
from tests.support.room_client import RoomClient
from voxroom.store import keys

VOICE = "en-joe"
WAIT_TIMEOUT_MS = 1500


def _primary_and_replica(cluster: RedisClusterProcs, room: str) -> tuple[ClusterNode, ClusterNode]:
    with RedisCluster.from_url(cluster.url, socket_timeout=5) as rc:
        routed: Any = rc  # redis-py's get_node_from_key is untyped
        port = int(routed.get_node_from_key(keys.room_state(room)).port)
    primary = next(n for n in cluster.nodes if n.port == port)
    for node in cluster.nodes:
        with node.client() as r:
            info: Any = r.info("replication")
        if info["role"] == "slave" and int(info["master_port"]) == port:
            return primary, node
    raise AssertionError(f"no replica of {port}")


@contextlib.contextmanager
def _paused(node: ClusterNode) -> Iterator[None]:
    os.kill(node.process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(node.process.pid, signal.SIGCONT)


def _texts(node: ClusterNode, room: str) -> list[str]:
    """The room's ``:utt`` log as ``node`` holds it (a replica answers reads after ``READONLY``)."""
    with redis.Redis(port=node.port, socket_timeout=5, decode_responses=True,
                     single_connection_client=True) as r:
        r.execute_command("READONLY")
        entries: Any = r.xrange(keys.room_utterances(room))
    return [fields["text"] for _id, fields in entries]


def _answer(client: RoomClient, seq: int, since: int) -> dict[str, Any] | None:
    return next((m for m in client.got.messages[since:]
                 if m.get("seq") == seq and m.get("type") in ("accepted", "error")), None)


async def _say(client: RoomClient, text: str, seq: int) -> dict[str, Any]:
    since = len(client.got.messages)
    await client.say(text, voice=VOICE, seq=seq)
    await client.wait_for(lambda g: _answer(client, seq, since) is not None, 20)
    answer = _answer(client, seq, since)
    assert answer is not None
    return answer


@pytest.mark.timeout(180)
async def test_wait_on_the_rooms_primary_and_unavailable_while_its_replica_is_paused(
        redis_cluster: RedisClusterProcs, tmp_path: Path) -> None:
    # A fresh cluster's replicas confirm nothing for up to a second (Redis 7.0): the first WAIT
    # would time out, rightly answered unavailable, but not what this test is about.
    replicas_streaming(redis_cluster)
    room = f"wait-{uuid.uuid4().hex[:8]}"
    primary, replica = _primary_and_replica(redis_cluster, room)
    # Gateway and worker given other nodes than the room's: the routing finds the room's node.
    others = [n for n in redis_cluster.nodes if n not in (primary, replica)]
    worker = start_worker(others[0].url, tmp_path, engine="synthetic")
    gateway, port = start_gateway(others[1].url, tmp_path, VOXROOM_REDIS_WAIT_REPLICAS="1",
                                  VOXROOM_REDIS_WAIT_TIMEOUT_MS=str(WAIT_TIMEOUT_MS))
    try:
        async with RoomClient(port, room) as client:
            answer = await _say(client, "Line one.", 1)
            assert answer == {"type": "accepted", "seq": 1, "utterance": 1}
            assert _texts(replica, room) == ["Line one."]  # read at once: the replica has it

            with _paused(replica):
                answer = await _say(client, "Line two.", 2)
                assert answer["type"] == "error" and answer["code"] == "unavailable", answer
                assert answer["retry_after_ms"] > 0
                assert _texts(primary, room) == ["Line one.", "Line two."]
            answer = await _say(client, "Line two.", 2)  # the client resends the same seq
            assert answer["type"] == "error" and answer["code"] == "duplicate", answer
            assert _texts(replica, room) == ["Line one.", "Line two."]
            answer = await _say(client, "Line three.", 3)
            assert answer == {"type": "accepted", "seq": 3, "utterance": 3}
            assert _texts(replica, room) == ["Line one.", "Line two.", "Line three."]

            ends = await client.wait_ends(3, timeout=60)
            await asyncio.sleep(0.3)  # anything said twice would arrive by now
            assert [e["utterance"] for e in client.got.ends()] == [1, 2, 3], ends
            assert all(e["status"] == "ok" for e in ends), ends
            assert [s["text"] for s in client.got.of("start")] == ["Line one.", "Line two.", "Line three."]
            assert [f.seq for f in client.got.frames] == sorted(f.seq for f in client.got.frames)
        log = gateway.log_text()
        assert "replicas confirmed" in log and "Traceback" not in log, log[-3000:]
        assert "MOVED" not in log and "CROSSSLOT" not in log, log[-3000:]
    finally:
        gateway.stop()
        worker.stop()
