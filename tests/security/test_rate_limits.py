"""Per-connection rate limits: the token bucket with an injected clock (pure), then over a real
gateway started with small limits: says past the burst get ``rate_limited`` with a usable
``retry_after_ms``; a frame flood is refused, then closed with 1008; the room does not notice.
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
from collections.abc import Iterator

import pytest
import websockets
from hypothesis import given, settings
from hypothesis import strategies as st

from app.room.ratelimit import TokenBucket
from tests.conftest import Stack
from tests.support.processes import start_gateway
from tests.support.ws_clients import QueryClient, connect, next_json, ws_url
from voxroom.wire.protocol import CloseCode, ErrorCode

# --- the bucket, with the clock passed in ---------------------------------------------------------


def test_a_fresh_bucket_allows_its_burst_at_once_then_says_how_long_to_wait() -> None:
    bucket = TokenBucket(rate=2.0, burst=3.0, now=100.0)
    assert [bucket.take(100.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take(100.0) == pytest.approx(0.5)  # one token at 2 a second
    assert bucket.take(100.25) == pytest.approx(0.25)  # a refused take spends nothing
    assert bucket.take(100.5) == 0.0
    assert bucket.take(100.5) == pytest.approx(0.5)


def test_idle_time_refills_no_more_than_the_burst() -> None:
    bucket = TokenBucket(rate=10.0, burst=5.0, now=0.0)
    for _ in range(5):
        bucket.take(0.0)
    allowed = sum(bucket.take(3600.0) == 0.0 for _ in range(20))  # an hour idle
    assert allowed == 5


def test_costs_above_one_wait_for_the_whole_cost() -> None:
    bucket = TokenBucket(rate=4.0, burst=4.0, now=0.0)
    assert bucket.take(0.0, cost=3.0) == 0.0
    assert bucket.take(0.0, cost=3.0) == pytest.approx(0.5)  # 1 token left, 2 more at 4 a second
    assert bucket.take(0.5, cost=3.0) == 0.0


@settings(max_examples=200, deadline=None, database=None)
@given(rate=st.floats(0.5, 100.0), burst=st.integers(1, 50),
       gaps=st.lists(st.floats(0.0, 0.5), min_size=1, max_size=300))
def test_a_bucket_never_allows_more_than_burst_plus_rate_times_elapsed(rate: float, burst: int,
                                                                       gaps: list[float]) -> None:
    bucket = TokenBucket(rate=rate, burst=float(burst), now=0.0)
    now, allowed = 0.0, 0
    for gap in gaps:
        now += gap
        before = copy.copy(bucket)
        wait = bucket.take(now)
        if wait == 0.0:
            allowed += 1
        else:
            # The promised wait is enough (and not wildly more than needed): retry_after_ms is honest.
            assert 0.0 < wait <= 1.0 / rate + 1e-9
            assert before.take(now + wait + 1e-9) == 0.0
    assert allowed <= burst + rate * now + 1e-6


# --- over a real gateway with small limits ------------------------------------------------------

# A token every 2 s: the burst's three says must take all three tokens before one comes back,
# and each waits for its Redis write, which a busy machine can stretch past half a second.
SAY_RATE, SAY_BURST = 0.5, 3
FRAME_RATE, FRAME_BURST, FLOOD_CLOSE_AFTER = 20, 40, 50


@pytest.fixture(scope="module")
def limited_port(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    gateway, port = start_gateway(
        stack.redis_url, tmp_path_factory.mktemp("limited-gateway"),
        VOXROOM_SAY_RATE=str(SAY_RATE), VOXROOM_SAY_BURST=str(SAY_BURST), VOXROOM_FRAME_RATE=str(FRAME_RATE),
        VOXROOM_FRAME_BURST=str(FRAME_BURST), VOXROOM_FLOOD_CLOSE_AFTER=str(FLOOD_CLOSE_AFTER))
    try:
        yield port
    finally:
        gateway.stop()


async def test_says_past_the_burst_are_rate_limited_and_accepted_after_retry_after(limited_port: int,
                                                                                   room: str) -> None:
    ws = await connect(ws_url(limited_port, room))
    try:
        await next_json(ws, kind="welcome")
        for seq in range(1, SAY_BURST + 2):
            await ws.send(json.dumps({"type": "say", "seq": seq, "text": f"Line {seq}."}))
        replies = [await next_json(ws, kind=("accepted", "error")) for _ in range(SAY_BURST + 1)]
        assert [(r["type"], r["seq"]) for r in replies[:SAY_BURST]] == [("accepted", s) for s in range(1, 4)]
        limited = replies[SAY_BURST]
        assert limited["type"] == "error" and limited["code"] == ErrorCode.RATE_LIMITED
        assert limited["seq"] == SAY_BURST + 1
        # One token at 0.5 a second: at most 2000 ms (+1 ms of rounding up), and more than nothing.
        assert 0 < limited["retry_after_ms"] <= 1000 / SAY_RATE + 1
        await asyncio.sleep(limited["retry_after_ms"] / 1000)
        await ws.send(json.dumps({"type": "say", "seq": SAY_BURST + 1, "text": "Line 4, again."}))
        again = await next_json(ws, kind=("accepted", "error"))
        assert again == {"type": "accepted", "seq": SAY_BURST + 1, "utterance": SAY_BURST + 1}
    finally:
        await ws.close()


async def test_a_frame_flood_is_refused_then_closed_and_the_room_does_not_notice(limited_port: int,
                                                                                 room: str) -> None:
    async with QueryClient(limited_port, room) as bystander:
        flooder = await connect(ws_url(limited_port, room))
        await next_json(flooder, kind="welcome")
        replies: list[dict[str, object]] = []

        async def read() -> None:
            try:
                async for data in flooder:
                    if isinstance(data, str):
                        replies.append(json.loads(data))
            except websockets.ConnectionClosed:
                pass

        reader = asyncio.create_task(read(), name="flooder:reader")
        started = time.monotonic()
        sent = 0
        try:
            for i in range(500):
                await flooder.send(json.dumps({"type": "ping", "t": float(i)}))
                sent += 1
        except websockets.ConnectionClosed:
            pass
        await asyncio.wait_for(reader, 10)
        elapsed = time.monotonic() - started
        pongs = [r for r in replies if r["type"] == "pong"]
        limited = [r for r in replies if r.get("code") == ErrorCode.RATE_LIMITED]
        print(f"\nflood: {sent} pings sent in {elapsed:.2f} s; {len(pongs)} pongs, {len(limited)} rate_limited, "
              f"closed {flooder.close_code} {flooder.close_reason!r}")
        assert (flooder.close_code, flooder.close_reason) == (CloseCode.POLICY_VIOLATION, "flood: too many frames")
        # The burst, plus what the rate refilled while the flood lasted, got through; no more.
        assert FRAME_BURST <= len(pongs) <= FRAME_BURST + FRAME_RATE * elapsed + 1
        assert len(limited) >= FLOOD_CLOSE_AFTER - 1
        assert all(isinstance(r["retry_after_ms"], int) and r["retry_after_ms"] > 0 for r in limited)
        await flooder.close()
        # The rest of the room is served as if nothing happened.
        await bystander.say("Nothing to see here.", seq=1)
        ends = await bystander.wait_ends(1)
        assert ends[0]["status"] == "ok" and bystander.got.frames_of(ends[0]["utterance"])
        assert bystander.closed is None and bystander.got.of("error") == []
