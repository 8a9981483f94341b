"""Faults injected by killing and pausing real processes: workers, gateways, redis-server."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.processes import Proc, start_gateway, start_worker
from tests.support.room_client import Received, RoomClient, resume_point
from voxroom.store.server import RedisServer

LONG_LINE = ("Listen carefully, villagers: the night was long, the wolves were hungry, and in the morning "
             "the baker was gone, so tonight we must choose wisely and vote with care.")
FAST_CLAIM = {"VOXROOM_CLAIM_IDLE_MS": "1500"}


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    with RedisServer(data_dir=str(tmp_path), persist=True, fsync="always") as server:
        yield server


def final_take(got: Received, seq: int) -> list[int]:
    """Chunk indexes of the last take of an utterance (after its last restart)."""
    chunks: list[int] = []
    for f in got.frames:
        if f.seq != seq:
            continue
        if f.chunk == 0 and f.first:
            chunks = []
        chunks.append(f.chunk)
    return chunks


async def test_worker_killed_mid_utterance_is_taken_over_and_restarted_cleanly(own_redis: RedisServer,
                                                                               tmp_path: Path) -> None:
    first = start_worker(own_redis.url, tmp_path, name="doomed", **FAST_CLAIM)
    gateway, port = start_gateway(own_redis.url, tmp_path)
    second: Proc | None = None
    try:
        async with RoomClient(port, "crash") as a, RoomClient(port, "crash") as b:
            await a.say(LONG_LINE, voice="en-joe")
            await a.wait_for(lambda g: len(g.frames_of(1)) >= 20, 20)
            first.kill()  # SIGKILL mid-utterance: 0.8 s of it played, the rest never comes
            second = start_worker(own_redis.url, tmp_path, name="heir", **FAST_CLAIM)
            ends = await a.wait_ends(1, timeout=30)
            await b.wait_ends(1, timeout=10)
        assert ends[0]["status"] == "ok"
        starts = a.got.of("start")
        assert len(starts) == 2 and starts[1].get("restart") is True
        for client in (a, b):
            take = final_take(client.got, 1)
            assert take == list(range(ends[0]["chunks"])), "the final take must be whole, once, in order"
            # The first take was cut short, so clients got chunk 0 twice: once per take, never more.
            assert sum(1 for f in client.got.frames if f.chunk == 0) == 2
        assert "claimed room crash utterance 1" in second.log_text()
    finally:
        gateway.stop()
        for w in (first, second):
            if w is not None:
                w.stop()


async def test_gateway_killed_clients_resume_on_another_without_loss(own_redis: RedisServer,
                                                                     tmp_path: Path) -> None:
    worker = start_worker(own_redis.url, tmp_path)
    doomed, port_a = start_gateway(own_redis.url, tmp_path)
    other, port_b = start_gateway(own_redis.url, tmp_path)
    try:
        a = RoomClient(port_a, "hop")
        await a.__aenter__()
        async with RoomClient(port_b, "hop") as witness:
            await a.say(LONG_LINE, voice="en-joe")
            await a.wait_for(lambda g: len(g.frames_of(1)) >= 15, 20)
            doomed.kill()
            await a.wait_for(lambda g: False, 0.0) if a.closed else None
            await asyncio.sleep(0.6)  # the client notices, backs off a little, reconnects elsewhere
            before = a.got
            # What it holds goes in the URL: the new gateway replays from there, then goes live.
            async with RoomClient(port_b, "hop", resume=resume_point(before)) as again:
                ends = await again.wait_ends(1, timeout=30)
            await witness.wait_ends(1, timeout=10)
        await a.__aexit__(None, None, None)
        n = ends[0]["chunks"]
        got = [f.chunk for f in before.frames_of(1)] + [f.chunk for f in again.got.frames_of(1)]
        assert sorted(got) == list(range(n)), "every slice exactly once across the two gateways"
        assert [f.chunk for f in witness.got.frames_of(1)] == list(range(n))
    finally:
        for g in (doomed, other):
            g.stop()
        worker.stop()


async def test_redis_restart_keeps_accepted_utterances_and_everyone_reconnects(own_redis: RedisServer,
                                                                               tmp_path: Path) -> None:
    worker = start_worker(own_redis.url, tmp_path)
    gateway, port = start_gateway(own_redis.url, tmp_path)
    try:
        async with RoomClient(port, "storm") as client:
            await client.say("Before the storm.", voice="en-espeak")
            await client.wait_ends(1)
            os.kill(worker.pid, signal.SIGSTOP)  # the worker cannot read: the next line stays queued
            await client.say("Accepted while the worker slept.", voice="en-espeak")
            await client.wait_for(lambda g: len(g.of("accepted")) >= 2, 10)
            own_redis.kill()
            own_redis.start()
            os.kill(worker.pid, signal.SIGCONT)
            ends = await client.wait_ends(2, timeout=40)
            assert ends[1]["status"] == "ok" and len(client.got.frames_of(2)) > 10
            # And the whole path works again after the restart: a new line, a new utterance.
            await client.say("After the storm.", voice="en-espeak")
            ends = await client.wait_ends(3, timeout=30)
            assert [e["utterance"] for e in ends] == [1, 2, 3]
        assert worker.alive() and gateway.alive()
    finally:
        gateway.stop()
        worker.stop()


async def test_graceful_shutdown_closes_clients_with_1012_and_workers_finish_their_line(
        own_redis: RedisServer, tmp_path: Path) -> None:
    worker = start_worker(own_redis.url, tmp_path)
    gateway, port = start_gateway(own_redis.url, tmp_path)
    spare, port_b = start_gateway(own_redis.url, tmp_path)
    try:
        async with RoomClient(port_b, "bye") as listener:
            async with RoomClient(port, "bye") as client:
                await client.say("A line long enough to be cut in the middle if the worker did not wait for it.",
                                 voice="en-joe")
                await client.wait_for(lambda g: len(g.frames) >= 5, 20)
                os.kill(worker.pid, signal.SIGTERM)
                gateway.popen.send_signal(signal.SIGTERM)
                await client.wait_for(lambda g: False, 0) if client.closed else None
                await asyncio.wait_for(_closed(client), 15)
                assert client.closed is not None and client.closed[0] == 1012
            ends = await listener.wait_ends(1, timeout=30)
            assert ends[0]["status"] == "ok"
            assert [f.chunk for f in listener.got.frames_of(1)] == list(range(ends[0]["chunks"]))
        assert worker.popen.wait(20) == 0
        assert gateway.popen.wait(20) == 0
    finally:
        for p in (gateway, spare, worker):
            p.stop()


async def _closed(client: RoomClient) -> None:
    while client.closed is None:
        await asyncio.sleep(0.05)
