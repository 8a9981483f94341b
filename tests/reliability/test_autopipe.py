"""voxroom/store/autopipe.py against a real redis-server: batching, order, errors, a Redis that dies."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from redis.exceptions import BusyLoadingError, DataError, OutOfMemoryError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError

from voxroom.store import clients as redis_client
from voxroom.store.autopipe import AutoPipeline, pack
from voxroom.store.backoff import REDIS_DOWN
from voxroom.store.server import RedisServer


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
    # A 1 s reply timeout: a redis-server shared with a busy suite can be a few hundred ms late
    # answering the PINGs below, which must not time out.
    auto = AutoPipeline(redis, timeout_s=1.0)
    try:
        assert await auto.call("PING") == "PONG"
        await asyncio.sleep(0.1)  # the reader now waits on an idle connection
        started = asyncio.get_running_loop().time()
        with pytest.raises(Exception, match="no reply from redis"):
            await auto.call("BLPOP", _key(), 10)
        assert asyncio.get_running_loop().time() - started < 5, "the deadline held for a command sent while idle"
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


async def test_error_replies_raise_redis_py_classes_so_retry_loops_catch_them(redis_url: str) -> None:
    """-OOM is redis-py's OutOfMemoryError, -LOADING its BusyLoadingError: both in REDIS_DOWN."""
    server = RedisServer().start()
    redis = redis_client.from_url(server.url, decode_responses=True)
    auto = AutoPipeline(redis)
    try:
        await redis.config_set("maxmemory-policy", "noeviction")
        await redis.config_set("maxmemory", 1)
        with pytest.raises(OutOfMemoryError) as oom:
            await auto.call("SET", "k", "v")
        assert isinstance(oom.value, REDIS_DOWN)
        with pytest.raises(OutOfMemoryError):  # a write inside a script: the same class
            await auto.call("EVAL", "return redis.call('SET', KEYS[1], 'v')", 1, "k")
        await redis.config_set("maxmemory", 0)
        assert await auto.call("SET", "k", "v") == "OK"
    finally:
        await auto.aclose()
        await redis.aclose()
        server.stop()

    async def loading(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(65536):
            writer.write(b"-LOADING Redis is loading the dataset in memory\r\n")
        writer.close()

    fake = await asyncio.start_server(loading, "127.0.0.1", 0)
    port = fake.sockets[0].getsockname()[1]
    auto = AutoPipeline(redis_client.from_url(f"redis://127.0.0.1:{port}/0"))
    try:
        with pytest.raises(BusyLoadingError) as busy:
            await auto.call("GET", "k")
        assert isinstance(busy.value, REDIS_DOWN)
    finally:
        await auto.aclose()
        await auto.redis.aclose()
        fake.close()
        await fake.wait_closed()


async def test_a_command_that_cannot_be_encoded_fails_alone(redis_url: str) -> None:
    """A lone surrogate (JSON "\\ud800") has no UTF-8 form: that caller gets DataError; the callers
    queued in the same loop turn get their replies, and the pipeline keeps working."""
    redis = redis_client.from_url(redis_url, decode_responses=True)
    auto = AutoPipeline(redis)
    key = _key()
    try:
        before = asyncio.ensure_future(auto.call("INCR", key))
        bad = asyncio.ensure_future(auto.call("SET", key + "-x", "\ud800"))
        after = asyncio.ensure_future(auto.group([("INCR", key), ("GET", key)]))
        assert await before == 1
        with pytest.raises(DataError):
            await bad
        assert await after == [2, "2"]
        assert auto.batches_sent == 1, "all three were queued in one loop turn"
        assert await auto.call("GET", key) == "2"
    finally:
        await auto.aclose()
        await redis.delete(key)
        await redis.aclose()


async def test_a_paused_loop_is_not_a_dead_redis(redis_url: str) -> None:
    """After the process was paused (SIGSTOP) or its loop blocked for longer than the reply
    timeout, the replies are waiting in the socket: they are delivered, not failed."""
    redis = redis_client.from_url(redis_url, decode_responses=True)
    auto = AutoPipeline(redis, timeout_s=1.0)  # not less: the PINGs must not time out on a busy machine
    try:
        assert await auto.call("PING") == "PONG"
        pending = asyncio.ensure_future(auto.call("ECHO", "still here"))
        await asyncio.sleep(0)  # queued; the flush runs on the next turn
        await asyncio.sleep(0)
        time.sleep(3.0)  # the whole loop stops, as under SIGSTOP, well past timeout_s
        assert await pending == "still here"
        assert await auto.call("PING") == "PONG"
    finally:
        await auto.aclose()
        await redis.aclose()
