"""Back-pressure and slow listeners, with real clients over real sockets."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import socket
import uuid
from pathlib import Path
from typing import cast

import numpy as np
import psutil
from starlette.websockets import WebSocket

from app.fanout.connection import ClientConnection
from app.fanout.hub import RoomHub
from tests.conftest import Stack
from tests.support.processes import start_gateway, start_worker
from tests.support.room_client import RoomClient
from tests.support.stores import Stores
from voxroom.store import clients as redis_client
from voxroom.store import keys
from voxroom.store.server import RedisServer

LONG_LINE = ("The village gathers at dawn. Somebody among you is not who they claim to be, and before the sun "
             "sets again you will have to decide, together, who that somebody is.")


def raw_listener(port: int, room: str) -> socket.socket:
    """A WebSocket client that completes the handshake and then never reads a byte."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the kernel buffers little for it
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall((f"GET /rooms/{room}/ws HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                  f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)  # exactly the handshake reply, nothing more
    assert head.startswith(b"HTTP/1.1 101"), head[:80]
    return sock


async def test_a_listener_that_stops_reading_never_stalls_its_room(stack: Stack, room: str) -> None:
    gateway = psutil.Process(stack.gateway.pid)
    rss_before = gateway.memory_info().rss
    stalled = [raw_listener(stack.port, room) for _ in range(3)]
    try:
        async with RoomClient(stack.port, room) as healthy:
            await healthy.say(LONG_LINE, voice="en-joe")
            await healthy.say("And a second line right behind it.", voice="en-espeak")
            ends = await healthy.wait_ends(2, timeout=60)
        for end in ends:
            chunks = [f.chunk for f in healthy.got.frames_of(end["utterance"])]
            assert chunks == list(range(end["chunks"])), "the healthy listener lost nothing"
        assert [f.seq for f in healthy.got.frames] == sorted(f.seq for f in healthy.got.frames), "in order"
        # How evenly the slices arrived beside stalled listeners is a time, measured in
        # bench/stalled_listeners.py (a millisecond bound here failed whenever CI's cores were busy).
        grown_mb = (gateway.memory_info().rss - rss_before) / 2**20
        assert grown_mb < 40, f"gateway grew {grown_mb:.1f} MB holding audio for stalled clients"
    finally:
        for sock in stalled:
            sock.close()


async def test_a_full_room_answers_busy_with_retry_after(tmp_path: Path) -> None:
    redis = RedisServer().start()  # its own: only the worker we pause may take the lines
    worker = start_worker(redis.url, tmp_path)
    gateway, port = start_gateway(redis.url, tmp_path, VOXROOM_MAX_PENDING_PER_ROOM="3")
    try:
        async with RoomClient(port, "crowded") as client:
            os.kill(worker.pid, signal.SIGSTOP)  # nothing plays, so the backlog only grows
            try:
                for n in range(1, 5):
                    await client.say(f"Line number {n}.", voice="en-espeak")
                await client.wait_for(lambda g: len(g.of("accepted")) + len(g.of("error")) >= 4, 10)
            finally:
                os.kill(worker.pid, signal.SIGCONT)
            assert [m["seq"] for m in client.got.of("accepted")] == [1, 2, 3]
            (busy,) = client.got.of("error")
            assert busy["code"] == "busy" and busy["seq"] == 4 and busy["retry_after_ms"] > 0
            await client.wait_ends(3, timeout=30)
            await asyncio.sleep(busy["retry_after_ms"] / 1000)
            await client.say("Line number 4.", voice="en-espeak", seq=4)  # the same seq, resent later
            ends = await client.wait_ends(4, timeout=30)
            assert [e["utterance"] for e in ends] == [1, 2, 3, 4]
    finally:
        gateway.stop()
        worker.stop()
        redis.stop()


async def test_a_line_too_long_to_speak_is_cut_faded_and_frees_the_room(tmp_path: Path) -> None:
    # Its own Redis: the session's shared worker (no cut) must not be the one that takes the line.
    redis = RedisServer().start()
    worker = start_worker(redis.url, tmp_path, VOXROOM_MAX_UTTERANCE_MS="2000")
    gateway, port = start_gateway(redis.url, tmp_path)
    try:
        async with RoomClient(port, "hostile") as client:
            await client.say("% & * # @ ! " * 40, voice="en-espeak")  # minutes of symbol names
            await client.say("The next line still plays.", voice="en-espeak")
            ends = await client.wait_ends(2, timeout=30)
        assert ends[0]["chunks"] == 2000 // 40, "cut at VOXROOM_MAX_UTTERANCE_MS"
        tail = client.got.audio(1)[-40:].astype(float)
        assert abs(tail).max() < 400, "the cut is faded out, not a click"
        assert ends[1]["status"] == "ok" and ends[1]["chunks"] > 10
    finally:
        gateway.stop()
        worker.stop()
        redis.stop()


async def test_a_crowd_joining_and_leaving_at_once_loses_no_room(stack: Stack, tmp_path: Path) -> None:
    """Hundreds of clients, each alone in its room, leave at once, and then join at once. Every
    join and leave touches Redis (the room's tail, the hub reader's wake); redis-py's default pool
    fails the 101st concurrent command, which once left rooms half-joined and leaves failing with
    a KeyError. Afterwards a room of the crowd must still speak and hear."""
    gateway, port = start_gateway(stack.redis_url, tmp_path)
    crowd = [f"crowd-{os.getpid()}-{i}" for i in range(250)]
    try:
        # Sockets dropped all at once (no close handshake): the gateway sees 250 leaves in a burst.
        sockets = [raw_listener(port, room) for room in crowd]
        for sock in sockets:
            sock.close()
        clients = [RoomClient(port, room) for room in crowd[:150]]
        await asyncio.gather(*(c.__aenter__() for c in clients))
        assert all(c.got.of("welcome") for c in clients)
        await asyncio.gather(*(c.__aexit__(None, None, None) for c in clients))
        async with RoomClient(port, crowd[7]) as client:
            await client.say("The crowd has left the square.", voice="en-espeak")
            ends = await client.wait_ends(1, timeout=30)
            assert ends[0]["status"] == "ok"
            audio = client.got.audio(ends[0]["utterance"])
            assert len(audio) / 24_000 > 0.8, "a line of six words is more than 0.8 s of speech"
            assert float(np.sqrt(np.mean(audio.astype(np.float64) ** 2))) > 300, "speech, not silence"
        log = gateway.log_text()
        assert "Exception in ASGI application" not in log, log[-3000:]
        assert "Traceback" not in log, log[-3000:]
    finally:
        gateway.stop()


async def test_the_hub_takes_hundreds_of_joins_and_leaves_at_once(redis_url: str, stores: Stores) -> None:
    """The crowd one level down, deterministic: 300 rooms leave while 300 others join, in one
    loop turn. Every leave wakes its reader and every join reads its room's tail; on redis-py's
    default pool (100 connections) the leaves' wakes took them all and the joins failed with
    ``MaxConnectionsError``, leaving rooms half-joined (a later leave raised ``KeyError``)."""
    redis = redis_client.from_url(redis_url, decode_responses=False)
    hub = RoomHub(await stores.open(redis), f"test-{uuid.uuid4().hex[:6]}")
    tag = uuid.uuid4().hex[:8]

    def crowd(name: str) -> list[ClientConnection]:
        return [ClientConnection(cast(WebSocket, None), room=f"hub-{tag}-{name}-{i}", client_id="c")
                for i in range(300)]

    first, second = crowd("a"), crowd("b")
    try:
        await asyncio.gather(*(hub.join(c) for c in first))
        await asyncio.gather(*(hub.leave(c) for c in first), *(hub.join(c) for c in second))
        assert set(hub.rooms) == {c.room for c in second}
        assert all(c.joined_at == "0-0" for c in second), "an empty room's output starts from 0-0"
        await asyncio.gather(*(hub.leave(c) for c in second))
        assert hub.rooms == {}
        # The readers still run and serve a room that joins afterwards.
        again = ClientConnection(cast(WebSocket, None), room=f"hub-{tag}-again", client_id="c")
        await hub.join(again)
        await redis.xadd(keys.room_output(again.room), {"kind": "chunk", "seq": 1, "chunk": 0, "frame": b"x"})
        async with asyncio.timeout(5):
            while again.depth == 0:  # noqa: ASYNC110 (a test polling a plain counter)
                await asyncio.sleep(0.01)
        assert all(r.task is not None and not r.task.done() for r in hub.source._readers)
    finally:
        await hub.aclose()
        await redis.aclose()
