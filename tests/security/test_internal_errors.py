"""A frame whose handling fails unexpectedly is answered with ``internal`` and costs nothing else:
the socket stays open, the room keeps speaking. The fault here is a real one: an operator's
``redis-cli`` leaves a room key of the wrong type (WRONGTYPE is neither bad input nor Redis being
down, so nothing on the way expects it). Before, the exception ended the connection (1011)."""

from __future__ import annotations

import redis.asyncio as aioredis

from tests.conftest import Stack
from tests.support.room_client import RoomClient
from voxroom.store import keys
from voxroom.wire.protocol import ErrorCode


async def test_a_frame_that_fails_unexpectedly_is_answered_internal_and_the_socket_lives(stack: Stack) -> None:
    room = "internal-fault"
    r = aioredis.Redis.from_url(stack.redis_url, decode_responses=True)
    try:
        async with RoomClient(stack.port, room) as client:
            await r.set(keys.room_state(room), "not a hash")  # the say script's HSET now fails
            seq = await client.say("This line meets a broken key.")
            await client.wait_for(lambda g: any(m.get("code") == ErrorCode.INTERNAL for m in g.of("error")), 30)
            await client.send_json({"type": "ping", "t": 1})
            await client.wait_for(lambda g: g.of("pong"), 30)
            assert client.closed is None, "the connection survived"
            await r.delete(keys.room_state(room))
            await client.say("And this one is spoken.", seq=seq + 1)
            ends = await client.wait_ends(1, timeout=60)
        assert ends[0]["status"] == "ok"
        assert client.got.audio(ends[0]["utterance"]).size > 0
    finally:
        await r.delete(*[k async for k in r.scan_iter(keys.room_pattern(room))])
        await r.aclose()
