"""``duplicate`` means stored (issue 32): a line refused ``unavailable`` and resent with the same
``seq`` after a later line of the same client was stored is spoken, once, after it; only a line
that was stored is answered ``duplicate``. Over real processes on one Redis, with the refusal
made the way it happens there: Redis out of memory (``maxmemory`` below what it uses). The Redis
Cluster case (a primary killed with two lines in flight) is in tests/cluster/test_cluster_failover.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.support.processes import start_gateway, start_worker
from tests.support.room_client import RoomClient
from voxroom.store.server import RedisServer

VOICE = "en-espeak"


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


async def test_a_line_refused_unavailable_and_resent_after_a_later_one_is_spoken_once(
        own_redis: RedisServer, tmp_path: Path) -> None:
    worker = start_worker(own_redis.url, tmp_path)
    gateway, port = start_gateway(own_redis.url, tmp_path)
    admin = redis.Redis.from_url(own_redis.url)
    try:
        async with RoomClient(port, "resent") as client:
            await client.say("The first line.", voice=VOICE, seq=1)
            await client.wait_ends(1, timeout=30)
            admin.config_set("maxmemory-policy", "noeviction")
            admin.config_set("maxmemory", 1)  # every write refused: the next say is not stored
            try:
                await client.say("The refused line.", voice=VOICE, seq=2)
                await client.wait_for(lambda g: any(e.get("seq") == 2 for e in g.of("error")), 15)
            finally:
                admin.config_set("maxmemory", 0)
            [refused] = [e for e in client.got.of("error") if e.get("seq") == 2]
            assert refused["code"] == "unavailable", refused
            await client.say("The line sent after it.", voice=VOICE, seq=3)
            await client.wait_for(lambda g: any(a["seq"] == 3 for a in g.of("accepted")), 15)
            await client.say("The refused line.", voice=VOICE, seq=2)  # the resend
            await client.wait_for(lambda g: any(a["seq"] == 2 for a in g.of("accepted")), 15)
            await client.say("The refused line.", voice=VOICE, seq=2)  # stored now: a duplicate
            await client.wait_for(lambda g: sum(e.get("seq") == 2 for e in g.of("error")) == 2, 15)
            assert [e["code"] for e in client.got.of("error") if e.get("seq") == 2] == ["unavailable", "duplicate"]
            ends = await client.wait_ends(3, timeout=40)
        # Each stored line spoken once, in the order stored: the resent one after the later line.
        assert [s["text"] for s in client.got.of("start")] == [
            "The first line.", "The line sent after it.", "The refused line."]
        assert [e["status"] for e in ends] == ["ok", "ok", "ok"]
        assert all(len(client.got.frames_of(e["utterance"])) > 5 for e in ends)
        accepted = {a["seq"]: a["utterance"] for a in client.got.of("accepted")}
        assert accepted[3] < accepted[2]
    finally:
        admin.config_set("maxmemory", 0)
        admin.close()
        gateway.stop()
        worker.stop()
