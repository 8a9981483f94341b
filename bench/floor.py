"""The floor under bench/latency.py: the same hops with nothing else on them.

    .venv/bin/python bench/floor.py [--rounds 10] [--rooms 1,10,100]

voxroom's realtime path is: client -> gateway (WebSocket frame in, a Redis script) -> worker
(consumer-group read, engine, slices published to the room's output stream) -> gateway (blocked
read over its rooms, WebSocket frame out) -> client. This script builds the least Python that
takes those hops, in the same processes on the same libraries, and measures it the way
bench/latency.py measures voxroom: ``say`` sent -> first audio frame received, minus the engine's
time to first chunk (here a timer, measured in-process in the same run).

- gateway: a raw ASGI app on uvicorn (uvloop, httptools, and the WebSocket implementation
  ``voxroom gateway`` gets, uvicorn's ``auto``; ``FLOOR_WS=websockets`` or ``wsproto`` to compare),
  no Starlette, no validation, no rate limits, no per-client writer queue. A ``say`` is one ``XADD`` (through
  voxroom/store/autopipe.py, so lines of one loop turn share a round trip); one task per connection.
  One reader task holds a blocked ``XREAD`` over every room's output stream and awaits each send.
- worker: one uvloop loop, ``XREADGROUP`` on the job stream; each job fires a 50 ms timer (the
  engine) and then publishes one 40 ms slice (a real voxroom audio frame) and acks, pipelined.
  No threads, no ordering, no pacing, no cache.
- client: bench/_wsclient.py's lean listener, one socket per room, all in one process.

What it leaves out is what voxroom exists for (order across workers, pacing, back-pressure,
validation, fan-out to many listeners); the difference between the two tables is what those cost
here. What it keeps is the floor the issue names: two Redis hops and two WebSocket frames per
line, in Python, four processes on this machine's two cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from _wsclient import Listener, connect, percentiles  # noqa: E402

from tests.support.processes import free_port, wait_http  # noqa: E402
from voxroom.store import clients as redis_client  # noqa: E402
from voxroom.store.autopipe import AutoPipeline  # noqa: E402
from voxroom.store.server import RedisServer  # noqa: E402
from voxroom.wire.protocol import ROOM_RATE, SLICE_SAMPLES, AudioFrame  # noqa: E402

JOBS = "floor:jobs"
TTFC_S = 0.050
WS_IMPL = os.environ.get("FLOOR_WS", "auto")  # what `voxroom gateway` runs (websockets-sansio here)
SEQ_CHUNK = struct.Struct(">II")  # bytes 12..19 of the audio header


def out_key(room: str) -> str:
    return f"floor:room:{room}:out"


# -- gateway -------------------------------------------------------------------------------------


class FloorGateway:
    def __init__(self, url: str) -> None:
        self.url = url
        self.rooms: dict[str, list[Any]] = {}
        self.auto: AutoPipeline | None = None
        self.reader: asyncio.Task[None] | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                self.auto = AutoPipeline(redis_client.from_url(self.url))
                self.reader = asyncio.create_task(self.read_loop())
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] == "http":  # readiness probe
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        room = scope["path"].split("/")[2]
        await receive()  # websocket.connect
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.send", "text": '{"type":"welcome"}'})
        self.rooms.setdefault(room, []).append(send)
        auto = self.auto
        assert auto is not None
        try:
            while True:
                message = await receive()
                if message["type"] == "websocket.disconnect":
                    return
                say = json.loads(message["text"])
                await auto.call("XADD", JOBS, "MAXLEN", "~", 10_000, "*", "room", room, "seq", say["seq"],
                                "text", say["text"])
                await send({"type": "websocket.send", "text": json.dumps({"type": "accepted", "seq": say["seq"]})})
        finally:
            self.rooms[room].remove(send)

    async def read_loop(self) -> None:
        wire = AutoPipeline(redis_client.from_url(self.url), timeout_s=10)
        cursors: dict[str, str] = {}
        while True:
            for room in self.rooms:
                cursors.setdefault(room, "0-0")  # fresh streams: from their start
            if not cursors:
                await asyncio.sleep(0.05)
                continue
            rooms = list(cursors)
            # Blocks at most 100 ms, so that rooms joining later are picked up (the bench waits).
            resp = await wire.call("XREAD", "COUNT", 512, "BLOCK", 100, "STREAMS",
                                   *[out_key(r) for r in rooms], *[cursors[r] for r in rooms])
            for stream, entries in resp or []:
                room = stream.decode()[len("floor:room:"):-len(":out")]
                cursors[room] = entries[-1][0].decode()
                for _entry_id, flat in entries:
                    for send in self.rooms.get(room, []):
                        await send({"type": "websocket.send", "bytes": flat[1]})


def run_gateway(url: str, port: int) -> None:
    import uvicorn

    uvicorn.run(FloorGateway(url), host="127.0.0.1", port=port, loop="uvloop", http="httptools",
                ws=WS_IMPL, log_level="warning", lifespan="on")


# -- worker --------------------------------------------------------------------------------------


async def worker(url: str) -> None:
    redis = redis_client.from_url(url)
    with contextlib.suppress(Exception):
        await redis.xgroup_create(JOBS, "g", id="$", mkstream=True)
    reads = AutoPipeline(redis, timeout_s=10)
    writes = AutoPipeline(redis)
    loop = asyncio.get_running_loop()
    silence = b"\x01\x00" * SLICE_SAMPLES
    tasks: set[asyncio.Task[Any]] = set()

    def publish(entry_id: bytes, room: str, seq: int) -> None:
        frame = AudioFrame(room=room, seq=seq, chunk=0, pts_us=int(time.time() * 1e6), sample_rate=ROOM_RATE,
                           samples=SLICE_SAMPLES, payload=silence, first=True, last=True).encode()
        task = asyncio.ensure_future(writes.group([
            ("XADD", out_key(room), "MAXLEN", "~", 1000, "*", "frame", frame), ("XACK", JOBS, "g", entry_id)]))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    print("ready", flush=True)
    while True:
        resp = await reads.call("XREADGROUP", "GROUP", "g", "w", "COUNT", 512, "BLOCK", 1000, "STREAMS", JOBS, ">")
        for _stream, entries in resp or []:
            for entry_id, flat in entries:
                fields = dict(zip(flat[::2], flat[1::2], strict=True))
                loop.call_later(TTFC_S, publish, entry_id, fields[b"room"].decode(), int(fields[b"seq"]))


def run_worker(url: str) -> None:
    import uvloop

    uvloop.run(worker(url))


# -- client --------------------------------------------------------------------------------------


class FloorSpeaker(Listener):
    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.first_audio: dict[int, float] = {}
        self.heard = asyncio.Event()

    def audio_frame(self, buf: bytearray, head: int) -> None:
        seq, _chunk = SEQ_CHUNK.unpack_from(buf, head + 12)
        self.first_audio.setdefault(seq, time.time() * 1000)
        self.heard.set()


async def timer_ttfc_ms(runs: int = 50) -> float:
    """The 'engine': how long a 50 ms timer takes on this loop, measured here."""
    loop = asyncio.get_running_loop()
    times = []
    for _ in range(runs):
        done = loop.create_future()
        start = time.perf_counter()
        loop.call_later(TTFC_S, done.set_result, None)
        await done
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


async def measure(port: int, rooms: int, rounds: int) -> tuple[float, list[float]]:
    speakers = []
    for i in range(rooms):
        speaker = await connect("127.0.0.1", port, f"/rooms/f{rooms}-{i}/ws", kind=FloorSpeaker)
        assert isinstance(speaker, FloorSpeaker)
        speakers.append(speaker)
    await asyncio.sleep(0.3)  # the gateway's reader picks up new rooms within 100 ms
    ttfc = await timer_ttfc_ms()
    samples: list[float] = []
    for round_no in range(1, rounds + 2):
        sent = []
        for s in speakers:
            sent.append(time.time() * 1000)
            s.send_text(json.dumps({"type": "say", "seq": round_no, "text": f"The werewolves wake up. {round_no}"}))
        async with asyncio.timeout(10):
            for s in speakers:
                while round_no not in s.first_audio:
                    s.heard.clear()
                    await s.heard.wait()
        if round_no > 1:  # the first round warms connections up
            samples += [s.first_audio[round_no] - t - ttfc for s, t in zip(speakers, sent, strict=True)]
        await asyncio.sleep(0.1)
    for s in speakers:
        s.close()
    return ttfc, samples


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "gateway":
        run_gateway(sys.argv[2], int(sys.argv[3]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        run_worker(sys.argv[2])
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--rooms", default="1,10,100")
    args = parser.parse_args()
    import uvloop

    rows = []
    with RedisServer() as redis:
        port = free_port()
        worker_proc = subprocess.Popen([sys.executable, __file__, "worker", redis.url], stdout=subprocess.PIPE)
        gateway_proc = subprocess.Popen([sys.executable, __file__, "gateway", redis.url, str(port)])
        try:
            assert worker_proc.stdout is not None
            assert worker_proc.stdout.readline().strip() == b"ready"
            wait_http(f"http://127.0.0.1:{port}/")
            for rooms in [int(x) for x in args.rooms.split(",")]:
                ttfc, samples = uvloop.run(measure(port, rooms, args.rounds))
                rows.append((rooms, len(samples), ttfc, *percentiles(samples)))
        finally:
            for proc in (gateway_proc, worker_proc):
                proc.terminate()
                proc.wait(10)
    print(f"\nfloor: say -> first audio frame, minus the timer's own 50 ms; {args.rounds} rounds per row\n")
    print("| rooms at once | samples | timer ms | added p50 ms | added p95 ms | added p99 ms |")
    print("|---|---|---|---|---|---|")
    for rooms, n, ttfc, p50, p95, p99 in rows:
        print(f"| {rooms} | {n} | {ttfc:.2f} | {p50:.2f} | {p95:.2f} | {p99:.2f} |")


if __name__ == "__main__":
    main()
