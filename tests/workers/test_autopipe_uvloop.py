"""voxroom/store/autopipe.py on uvloop, the loop the worker and the gateway run (tests/reliability's
autopipe tests run on asyncio's own loop). Replies are read by a protocol callback; a libuv loop
runs due timers before it polls sockets, which the reply timeout's grace must allow for."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest
import uvloop
from redis import Redis as SyncRedis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from voxroom.store import clients as redis_client
from voxroom.store.autopipe import AutoPipeline
from voxroom.store.server import RedisServer


def on_uvloop(test: Callable[[], Awaitable[None]]) -> None:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(test())  # type: ignore[arg-type]


def test_replies_reach_their_callers_in_order_and_an_error_fails_its_caller_only(server: RedisServer) -> None:
    async def run() -> None:
        redis = redis_client.from_url(server.url, decode_responses=True)
        auto = AutoPipeline(redis)
        try:
            await auto.call("DEL", "uv:n")
            calls = [auto.call("INCR", "uv:n") for _ in range(50)]
            calls.insert(25, auto.call("HGET", "uv:n", "x"))  # WRONGTYPE, in the middle
            got = await asyncio.gather(*calls, return_exceptions=True)
            assert isinstance(got[25], ResponseError)
            assert got[:25] + got[26:] == list(range(1, 51))
            assert auto.batches_sent == 2, "the DEL, then the 51 of one loop turn in one batch"
        finally:
            await auto.aclose()
            await redis.aclose()

    on_uvloop(run)


def test_a_killed_connection_fails_what_is_in_flight_and_the_next_call_reconnects(server: RedisServer) -> None:
    async def run() -> None:
        redis = redis_client.from_url(server.url, decode_responses=True)
        auto = AutoPipeline(redis, timeout_s=10)
        try:
            own_id = await auto.call("CLIENT", "ID")
            waiting = asyncio.ensure_future(auto.call("BLPOP", "uv:never", 5))
            await asyncio.sleep(0.1)
            assert await redis.execute_command("CLIENT", "KILL", "ID", own_id) == 1
            with pytest.raises(RedisConnectionError):
                await waiting
            assert await auto.call("ECHO", "again") == "again"
            assert await auto.call("CLIENT", "ID") != own_id
        finally:
            await auto.aclose()
            await redis.aclose()

    on_uvloop(run)


def test_a_blocked_uvloop_is_not_a_dead_redis(server: RedisServer) -> None:
    """The loop stops well past the reply timeout with a reply waiting in the socket: libuv
    fires the timer before it reads the socket, and the grace lets the reply through."""
    async def run() -> None:
        redis = redis_client.from_url(server.url, decode_responses=True)
        auto = AutoPipeline(redis, timeout_s=1.0)  # not less: the PINGs must not time out on a busy machine
        try:
            assert await auto.call("PING") == "PONG"
            pending = asyncio.ensure_future(auto.call("ECHO", "still here"))
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            time.sleep(3.0)  # well past timeout_s
            assert await pending == "still here"
            assert await auto.call("PING") == "PONG"
        finally:
            await auto.aclose()
            await redis.aclose()

    on_uvloop(run)


def test_a_long_loop_turn_sends_what_it_held_past_max_hold(server: RedisServer) -> None:
    """The gateway's says (voxroom/store/lua/say.py): a loop turn that handles a burst of lines sends the
    first ones while it works on the rest, in order, instead of every line waiting for the
    turn's end. Without ``max_hold_s`` nothing leaves before the turn ends."""
    async def run() -> None:
        redis = redis_client.from_url(server.url, decode_responses=True)
        sync = SyncRedis.from_url(server.url, decode_responses=True)
        held = AutoPipeline(redis, max_hold_s=0.001)
        turn = AutoPipeline(redis)
        try:
            await held.call("DEL", "uv:held")
            await turn.call("DEL", "uv:turn")
            sent_before = (held.batches_sent, turn.batches_sent)
            # One loop turn: no await between these lines.
            first = held.submit([("RPUSH", "uv:held", "a")])
            turn.submit([("RPUSH", "uv:turn", "a")])
            time.sleep(0.005)  # the turn goes on: the rest of a burst is handled
            second = held.submit([("RPUSH", "uv:held", "b")])
            last = turn.submit([("RPUSH", "uv:turn", "b")])
            assert held.batches_sent - sent_before[0] == 1, "a and b left as the turn went on"
            assert turn.batches_sent == sent_before[1], "nothing leaves before the turn ends"
            # Redis has them while this loop turn still runs (a blocking client waits for it).
            deadline = time.monotonic() + 10
            while sync.lrange("uv:held", 0, -1) != ["a", "b"]:
                assert time.monotonic() < deadline, sync.lrange("uv:held", 0, -1)
                time.sleep(0.01)
            assert sync.lrange("uv:turn", 0, -1) == []
            third = held.submit([("RPUSH", "uv:held", "c")])  # queued just now: waits for the turn's end
            assert held.batches_sent - sent_before[0] == 1
            assert [await f for f in (first, second, third)] == [[1], [2], [3]]
            assert await last == [2]
            assert await held.call("LRANGE", "uv:held", 0, -1) == ["a", "b", "c"]
            assert held.batches_sent - sent_before[0] == 3
        finally:
            sync.close()
            await held.aclose()
            await turn.aclose()
            await redis.aclose()

    on_uvloop(run)
