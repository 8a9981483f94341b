"""Fan-out: how many listeners one gateway process keeps fed with 40 ms slices in real time.

A private redis-server, one ``voxroom gateway`` process, a publisher in this process standing in
for the workers (every room speaks continuously: one 40 ms slice per room every 40 ms, stamped
``pts = publish time + lead`` exactly as ``workers/output/publisher.py`` does), and listeners in rooms of
12 in a separate client process (a minimal WebSocket client, so the load generator stays cheap).

The listener count steps up (``--steps``); at each step, for ``--seconds``, every frame's arrival
is compared with its presentation time. A frame arriving after its ``pts`` is an underrun a
3-slice (120 ms = the lead) buffer would have had. A step passes when no frame was late and the
gateway dropped nothing (``voxroom_slices_dropped_total`` from its ``/metrics``).

    .venv/bin/python bench/fanout.py --steps 250,500,1000,1500,2000 --seconds 10
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import sys
import tempfile
import time
import urllib.request
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from _wsclient import Listener, connect, percentiles, raise_nofile  # noqa: E402

from tests.support.processes import start_gateway  # noqa: E402
from voxroom.store import keys  # noqa: E402
from voxroom.store.server import RedisServer  # noqa: E402
from voxroom.wire.protocol import ROOM_RATE, SLICE_SAMPLES, AudioFrame  # noqa: E402

PER_ROOM = 12
SLICE_MS = SLICE_SAMPLES * 1000 / ROOM_RATE


def room_of(i: int) -> str:
    return f"fan-{i // PER_ROOM}"


# -- client process ------------------------------------------------------------------------------


def client_main(port: int, conn: Connection) -> None:
    raise_nofile(20_000)
    asyncio.run(_client(port, conn))


async def _client(port: int, conn: Connection) -> None:
    listeners: list[Listener] = []
    delays: list[float] = []
    late = [0]
    me = psutil.Process()

    def on_audio(arrival_us: int, pts_us: int) -> None:
        delays.append((arrival_us - pts_us) / 1000.0)
        if arrival_us > pts_us:
            late[0] += 1

    loop = asyncio.get_running_loop()
    sem = asyncio.Semaphore(100)  # connects in flight

    async def one(i: int) -> None:
        async with sem:
            listeners.append(await connect("127.0.0.1", port, f"/rooms/{room_of(i)}/ws?client=l{i}", on_audio))

    while True:
        cmd, arg = await loop.run_in_executor(None, conn.recv)
        if cmd == "grow":

            await asyncio.gather(*(one(i) for i in range(len(listeners), arg)))
            conn.send(len(listeners))
        elif cmd == "reset":
            delays.clear()
            late[0] = 0
            me.cpu_percent()
            conn.send(True)
        elif cmd == "collect":
            closed = sum(1 for c in listeners if c.closed is not None)
            conn.send({"delays": list(delays), "late": late[0], "closed": closed, "cpu": me.cpu_percent()})
        elif cmd == "stop":
            for c in listeners:
                c.close()
            await asyncio.sleep(0.2)
            conn.send(True)
            return


# -- publisher -------------------------------------------------------------------------------------


class Publisher:
    """Every active room gets one slice per 40 ms tick, on an absolute schedule (no drift)."""

    def __init__(self, redis: Any, lead_ms: float) -> None:
        self.redis = redis
        self.lead_ms = lead_ms
        self.rooms: list[str] = []
        self.chunk = 0
        self.late_ticks = 0
        self.payload = b"\0" * (SLICE_SAMPLES * 2)

    async def run(self) -> None:
        next_tick = time.time() * 1000.0
        while True:
            now = time.time() * 1000.0
            if now > next_tick + SLICE_MS:
                self.late_ticks += 1
            pts_us = int((next_tick + self.lead_ms) * 1000)
            pipe = self.redis.pipeline(transaction=False)
            for room in self.rooms:
                frame = AudioFrame(room=room, seq=1, chunk=self.chunk, pts_us=pts_us, sample_rate=ROOM_RATE,
                                   samples=SLICE_SAMPLES, payload=self.payload).encode()
                pipe.xadd(keys.room_output(room), {"kind": "chunk", "seq": 1, "chunk": self.chunk, "frame": frame},
                          maxlen=200, approximate=True)
            if self.rooms:
                await pipe.execute()
            self.chunk += 1
            next_tick += SLICE_MS
            await asyncio.sleep(max(0.0, (next_tick - time.time() * 1000.0) / 1000.0))


def dropped(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("voxroom_slices_dropped_total{"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


async def run(args: argparse.Namespace) -> None:
    from redis.asyncio import Redis

    steps = [int(s) for s in args.steps.split(",")]
    raise_nofile(max(steps) * 2 + 1000)
    rows = []
    with tempfile.TemporaryDirectory(prefix="vx-bench-") as tmp, RedisServer() as server:
        # Every listener connects from this machine: no cap per address.
        gateway, port = start_gateway(server.url, Path(tmp), VOXROOM_LOG_LEVEL="WARNING",
                                      VOXROOM_MAX_CONNECTIONS_PER_ADDRESS="0")
        parent, child = mp.Pipe()
        client = mp.get_context("spawn").Process(target=client_main, args=(port, child), daemon=True)
        client.start()
        redis = Redis.from_url(server.url)
        publisher = Publisher(redis, args.lead_ms)
        pub_task = asyncio.create_task(publisher.run(), name="bench:publisher")
        gw = psutil.Process(gateway.pid)
        loop = asyncio.get_running_loop()

        async def ask(cmd: str, arg: Any = None) -> Any:
            parent.send((cmd, arg))
            return await loop.run_in_executor(None, parent.recv)

        try:
            for listeners in steps:
                await ask("grow", listeners)
                publisher.rooms = sorted({room_of(i) for i in range(listeners)})
                await asyncio.sleep(2.0)  # settle: new rooms' readers are up
                drop0 = await asyncio.to_thread(dropped, port)
                publisher.late_ticks = 0
                await ask("reset")
                gw.cpu_percent()
                await asyncio.sleep(args.seconds)
                gw_cpu = gw.cpu_percent()
                got = await ask("collect")
                drops = await asyncio.to_thread(dropped, port) - drop0
                delays = got["delays"]
                expected = len(publisher.rooms) * PER_ROOM * args.seconds * 1000 / SLICE_MS
                p50, p95, p99 = percentiles([d + args.lead_ms for d in delays])
                ok = got["late"] == 0 and drops == 0 and got["closed"] == 0
                us_per_frame = gw_cpu / 100 * args.seconds / max(1, len(delays)) * 1e6
                rows.append((listeners, len(publisher.rooms), len(delays) / args.seconds, len(delays) / expected,
                             p50, p95, p99, max(delays, default=float("nan")) + args.lead_ms, got["late"], int(drops),
                             gw_cpu, us_per_frame, got["cpu"], os.getloadavg()[0], "yes" if ok else "no"))
                print(f"step {listeners}: {rows[-1]}", flush=True)
                if not ok and args.stop_on_fail:
                    break
        finally:
            pub_task.cancel()
            await asyncio.gather(pub_task, return_exceptions=True)
            await ask("stop")
            client.join(5)
            await redis.aclose()
            gateway.stop()
    print(f"\nfan-out from one gateway process: rooms of {PER_ROOM}, every room speaking, 40 ms slices, "
          f"lead {args.lead_ms:.0f} ms, {args.seconds:.0f} s per step\n")
    print("| listeners | rooms | frames/s delivered | of expected | delivery p50 ms | p95 ms | p99 ms | max ms "
          "| late frames (underruns) | dropped | gateway CPU % | gateway CPU us/frame | client CPU % | load avg "
          "| real time |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]:.0f} | {r[3]:.3f} | {r[4]:.1f} | {r[5]:.1f} | {r[6]:.1f} | {r[7]:.1f} "
              f"| {r[8]} | {r[9]} | {r[10]:.0f} | {r[11]:.1f} | {r[12]:.0f} | {r[13]:.1f} | {r[14]} |")
    print(f"publisher ticks late by more than one slice: {publisher.late_ticks}")
    print("\ndelivery = arrival - (pts - lead): time from the slice's scheduled publish to the listener; "
          f"a frame is late when it arrives after its pts (delivery > {args.lead_ms:.0f} ms)")
    print(f"command: .venv/bin/python bench/fanout.py --steps {args.steps} --seconds {args.seconds:.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", default="250,500,1000,1500,2000", help="listener counts, ascending")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per step")
    parser.add_argument("--lead-ms", type=float, default=120.0, help="as VOXROOM_LEAD_MS")
    parser.add_argument("--stop-on-fail", action="store_true", help="stop at the first step with an underrun")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
