"""voxroom/autopipe.py against a real redis-server: batching, order, errors, a Redis that dies."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError, ResponseError

from voxroom import redis_client
from voxroom.autopipe import AutoPipeline, pack
from voxroom.redis_server import RedisServer


def _key() -> str:
    return f"t-auto-{uuid.uuid4().hex[:8]}"


def test_pack_is_resp() -> None:
    assert pack([("SET", "k", b"\x00\xff", 3, 1.5)]) == (
        b"*5\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\n\x00\xff\r\n$1\r\n3\r\n$3\r\n1.5\r\n")
    with pytest.raises(DataError):
        pack([("SET", "k", True)])
    with pytest.raises(DataError):
        pack([("SET", "k", None)])


async def test_many_tasks_share_one_batch_and_keep_their_order(redis_url: str) -> None:
    redis = redis_client.from_url(redis_url, decode_responses=True)
    auto = AutoPipeline(redis)
    key = _key()
    try:
        async def speaker(i: int) -> list[object]:
            return await auto.group([("RPUSH", key, f"{i}-a"), ("RPUSH", key, f"{i}-b"), ("LLEN", key)])

        results = await asyncio.gather(*(speaker(i) for i in range(100)))
        # One loop turn: every group in one batch (one write, one read).
        assert auto.batches_sent == 1 and auto.commands_sent == 300
        stored = await redis.lrange(key, 0, -1)
        assert stored == [f"{i}-{part}" for i in range(100) for part in "ab"], "groups stay whole and in order"
        assert [r[2] for r in results] == [2 * (i + 1) for i in range(100)]
        assert await auto.call("HMGET", key + "-none", "a", "b") == [None, None]
    finally:
        await auto.aclose()
        await redis.delete(key)
        await redis.aclose()


async def test_an_error_reply_fails_its_caller_only(redis_url: str) -> None:
    redis = redis_client.from_url(redis_url, decode_responses=False)
    auto = AutoPipeline(redis)
    key = _key()
    try:
        await redis.set(key, b"a string")
        good_before = asyncio.ensure_future(auto.call("INCR", key + "-n"))
        bad = asyncio.ensure_future(auto.group([("LPUSH", key, b"x"), ("GET", key)]))  # WRONGTYPE first
        good_after = asyncio.ensure_future(auto.call("GET", key))
        assert await good_before == 1
        with pytest.raises(ResponseError, match="WRONGTYPE"):
            await bad
        assert await good_after == b"a string", "replies after an error still reach their callers"
    finally:
        await auto.aclose()
        await redis.delete(key, key + "-n")
        await redis.aclose()


async def test_a_redis_that_dies_fails_the_callers_and_the_next_call_reconnects() -> None:
    server = RedisServer().start()
    redis = redis_client.from_url(server.url, decode_responses=True)
    auto = AutoPipeline(redis, timeout_s=2.0)
    try:
        assert await auto.call("SET", "k", "v") is not None
        # A command that holds Redis for longer than the reply timeout... then Redis dies.
        blocked = asyncio.ensure_future(auto.call("BLPOP", "never", 30))
        await asyncio.sleep(0.1)
        server.kill()
        with pytest.raises(RedisConnectionError):
            await blocked
        with pytest.raises(RedisConnectionError):
            await auto.call("GET", "k")  # nothing listens on the port now
        server.start()
        assert await auto.call("SET", "k", "again") in ("OK", True)
        assert await auto.call("GET", "k") == "again"
    finally:
        await auto.aclose()
        await redis.aclose()
        server.stop()


async def test_a_reply_that_never_comes_times_out(redis_url: str) -> None:
    redis = redis_client.from_url(redis_url, decode_responses=True)
    auto = AutoPipeline(redis, timeout_s=0.3)
    try:
        assert await auto.call("PING") == "PONG"
        await asyncio.sleep(0.1)  # the reader now waits on an idle connection
        started = asyncio.get_running_loop().time()
        with pytest.raises(Exception, match="no reply from redis"):
            await auto.call("BLPOP", _key(), 5)
        assert asyncio.get_running_loop().time() - started < 2, "the deadline held for a command sent while idle"
        assert await auto.call("PING") == "PONG", "a fresh connection after the timeout"
    finally:
        await auto.aclose()
        await redis.aclose()


async def test_the_connection_authenticates_and_selects_the_url_database() -> None:
    server = RedisServer().start()
    admin = redis_client.from_url(server.url, decode_responses=True)
    autos: list[AutoPipeline] = []
    try:
        await admin.execute_command("ACL", "SETUSER", "narrator", "on", ">tale", "~*", "+@all")
        await admin.config_set("requirepass", "s3cret")
        url = f"redis://:s3cret@127.0.0.1:{server.port}/3"
        auto = AutoPipeline(redis_client.from_url(url, decode_responses=True))
        autos.append(auto)
        assert await auto.call("SET", "where", "db3") in ("OK", True)
        user = AutoPipeline(redis_client.from_url(f"redis://narrator:tale@127.0.0.1:{server.port}/0"))
        autos.append(user)
        assert await user.call("ACL", "WHOAMI") == b"narrator"
        checker = redis_client.from_url(url, decode_responses=True)
        assert await checker.get("where") == "db3", "written to the database the URL names"
        await checker.aclose()
        wrong = AutoPipeline(redis_client.from_url(f"redis://:nope@127.0.0.1:{server.port}/0"))
        autos.append(wrong)
        with pytest.raises(RedisConnectionError, match="refused the handshake"):
            await wrong.call("PING")
    finally:
        for auto in autos:
            await auto.aclose()
            await auto.redis.aclose()
        await admin.aclose()
        server.stop()
