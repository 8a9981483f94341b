"""Clients that stop reading cost bounded memory and are let go (issue #13.3, #13.6 first half):
the resume bomb, and stalled readers reaped after ``VOXROOM_SEND_STALL_CLOSE_S``. Real processes."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import uuid
from pathlib import Path

import redis
import websockets

from tests.support.gauges import connections, peak_rss_mib, rss_mib, wait_connections
from tests.support.processes import start_gateway, start_worker
from tests.support.room_client import RoomClient
from voxroom.store import keys
from voxroom.wire.protocol import ROOM_RATE, SLICE_SAMPLES, AudioFrame

LONG_LINE = ("The village gathers at dawn. Somebody among you is not who they claim to be, and before the sun "
             "sets again you will have to decide, together, who that somebody is.")


def fill_history(redis_url: str, room: str, entries: int = 3000) -> None:
    """A room whose output stream holds ``entries`` slices of audio (2 minutes at 3000), as a busy
    room's would: what a ``resume`` from the start has to replay."""
    r = redis.Redis.from_url(redis_url)
    payload = bytes(SLICE_SAMPLES * 2)
    pipe = r.pipeline(transaction=False)
    per_line = 250
    for n in range(entries):
        seq, chunk = n // per_line + 1, n % per_line
        if chunk == 0:
            pipe.xadd(keys.room_output(room), {"kind": "start", "seq": seq, "sender": "s", "voice": "v",
                                               "text": "t", "pts_ms": 0, "rate": ROOM_RATE})
        frame = AudioFrame(room=room, seq=seq, chunk=chunk, pts_us=n * 40_000, sample_rate=ROOM_RATE,
                           samples=SLICE_SAMPLES, payload=payload, first=chunk == 0, last=False).encode()
        pipe.xadd(keys.room_output(room), {"kind": "chunk", "seq": seq, "chunk": chunk, "frame": frame})
        if chunk == per_line - 1:
            pipe.xadd(keys.room_output(room), {"kind": "end", "seq": seq, "chunks": per_line,
                                               "duration_ms": per_line * 40, "status": "ok"})
    pipe.execute()
    r.close()


async def test_a_resume_bomb_from_a_client_that_never_reads_costs_bounded_memory(
        redis_url: str, tmp_path: Path) -> None:
    room = f"bomb-{uuid.uuid4().hex[:8]}"
    fill_history(redis_url, room)
    # The stall reaper would close this client within seconds: give it a minute, so the resumes
    # themselves are what is measured.
    gateway, port = start_gateway(redis_url, tmp_path, VOXROOM_SEND_STALL_CLOSE_S="60")
    ws = None
    try:
        before = rss_mib(gateway.pid)
        # max_queue=1: the client library stops reading the socket after one message, as a
        # hostile or frozen client would; its sends still go out.
        ws = await websockets.connect(f"ws://127.0.0.1:{port}/rooms/{room}/ws", max_queue=1,
                                      compression=None, proxy=None, max_size=2**22)
        for _ in range(50):
            await ws.send(json.dumps({"type": "resume", "seq": 0, "chunk": 0}))
            await asyncio.sleep(0.1)
        await asyncio.sleep(2)  # let the gateway do whatever those asked for
        assert await connections(port) == 1
        grown = max(rss_mib(gateway.pid), peak_rss_mib(gateway.pid)) - before
        # Before: every resume queued the whole history again (50 x 3000 slices, ~300 MB).
        assert grown < 60, f"gateway grew {grown:.0f} MB for one client's resumes"
        await ws.close()
        assert await wait_connections(port, 0) == 0, "the connection's slot was not freed"
        assert gateway.alive()
    finally:
        if ws is not None:
            await ws.close()
        gateway.stop()


def raw_listener(port: int, room: str) -> socket.socket:
    """A WebSocket client that completes the handshake and then never reads a byte."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: a small window
    sock.connect(("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall((f"GET /rooms/{room}/ws HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                  f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)  # exactly the handshake reply, nothing more
    assert head.startswith(b"HTTP/1.1 101"), head[:80]
    return sock


def dropped(sock: socket.socket) -> bool:
    """Whether the gateway let this socket go: reading what it holds ends in EOF or a reset."""
    sock.settimeout(5)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return True


async def test_stalled_readers_are_closed_and_their_room_plays_on(redis_url: str, tmp_path: Path) -> None:
    room = f"stall-{uuid.uuid4().hex[:8]}"
    worker = start_worker(redis_url, tmp_path, name="stall-worker")
    gateway, port = start_gateway(redis_url, tmp_path, VOXROOM_SEND_STALL_CLOSE_S="2")
    stalled = [raw_listener(port, room) for _ in range(4)]
    try:
        async with RoomClient(port, room) as healthy:
            assert await wait_connections(port, 5) == 5
            await healthy.say(LONG_LINE, voice="en-joe")
            await healthy.say("And a second line right behind it, for good measure.", voice="en-joe")
            # The stalled ones fill their kernel buffers, then their queues, then are let go.
            assert await wait_connections(port, 1, timeout=90) == 1, "stalled readers still connected"
            ends = await healthy.wait_ends(2, timeout=90)
            for end in ends:
                chunks = [f.chunk for f in healthy.got.frames_of(end["utterance"])]
                assert chunks == list(range(end["chunks"])), "the reader that kept up lost nothing"
        assert all(dropped(sock) for sock in stalled)
        assert await wait_connections(port, 0) == 0
        assert "read nothing" in gateway.log_text(), "closed by the stall reaper, not by a keepalive timeout"
    finally:
        for sock in stalled:
            sock.close()
        gateway.stop()
        worker.stop()
