"""What ``VOXROOM_REDIS_WAIT_REPLICAS=1`` costs a ``say``: ``say`` sent -> ``accepted`` received,
with ``WAIT`` off (0) and on (1), on one Redis primary with one replica on loopback.

    .venv/bin/python bench/wait_replicas.py [--says 300] [--burst 100]

Starts its own primary and replica (``redis-server``, ``REPLICAOF``) and two gateways on them,
one per setting, taking turns (so both see the same machine). No worker: a heartbeat written here
makes the gateways take the voice, and the lines stay queued (rooms' backlog limit raised), so
synthesis costs nothing during the measurement. Two tables:

- one line at a time (``--says`` round trips on one connection): the latency one line pays;
- ``--burst`` rooms' clients sending one line each in the same loop turn, ``--says / 10`` rounds:
  the says of one loop turn share one ``WAIT`` (voxroom/store/lua/say.py), so a burst pays about one
  replica round trip, not one per line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis
import websockets

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from tests.support.processes import Proc, start_gateway  # noqa: E402
from voxroom.store import keys  # noqa: E402
from voxroom.store.server import RedisServer  # noqa: E402

VOICE = "en-joe"
# Per-connection limits off, and no backlog limit: the lines stay queued, never ``busy``.
FAST: dict[str, Any] = {
    "VOXROOM_SAY_RATE": "100000", "VOXROOM_SAY_BURST": "100000", "VOXROOM_MAX_PENDING_PER_ROOM": "1000000",
    "VOXROOM_FRAME_RATE": "100000", "VOXROOM_FRAME_BURST": "100000", "VOXROOM_LOG_LEVEL": "WARNING"}


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


async def _connect(port: int, room: str) -> websockets.ClientConnection:
    ws = await websockets.connect(f"ws://127.0.0.1:{port}/rooms/{room}/ws", max_size=2**20)
    while json.loads(await ws.recv()).get("type") != "welcome":
        pass
    return ws


async def _say(ws: websockets.ClientConnection, seq: int) -> float:
    start = time.perf_counter()
    await ws.send(json.dumps({"type": "say", "seq": seq, "text": f"Line {seq}.", "voice": VOICE}))
    while True:
        message = await ws.recv()
        if isinstance(message, str):
            msg = json.loads(message)
            if msg.get("seq") == seq and msg.get("type") in ("accepted", "error"):
                if msg["type"] != "accepted":
                    raise RuntimeError(f"say {seq} answered {msg}")
                return (time.perf_counter() - start) * 1000


async def one_at_a_time(port: int, says: int) -> list[float]:
    ws = await _connect(port, f"bench-wait-{uuid.uuid4().hex[:8]}")
    try:
        return [await _say(ws, seq) for seq in range(1, says + 1)]
    finally:
        await ws.close()


async def bursts(port: int, rooms: int, rounds: int) -> list[float]:
    """Each round: every room's client says one line at once; the round's time is the last answer."""
    tag = uuid.uuid4().hex[:6]
    sockets = await asyncio.gather(*(_connect(port, f"bench-burst-{tag}-{i}") for i in range(rooms)))
    try:
        times = []
        for seq in range(1, rounds + 1):
            start = time.perf_counter()
            await asyncio.gather(*(_say(ws, seq) for ws in sockets))
            times.append((time.perf_counter() - start) * 1000)
        return times
    finally:
        await asyncio.gather(*(ws.close() for ws in sockets))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--says", type=int, default=300)
    parser.add_argument("--burst", type=int, default=100)
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="bench-wait-"))
    with RedisServer() as primary, RedisServer() as replica:
        admin = redis.Redis(port=replica.port, decode_responses=True)
        admin.execute_command("REPLICAOF", "127.0.0.1", primary.port)  # type: ignore[no-untyped-call]
        while admin.info("replication").get("master_link_status") != "up":
            time.sleep(0.05)
        on_primary = redis.Redis(port=primary.port, decode_responses=True)
        # A worker's heartbeat (no worker): the gateways take the voice, nothing synthesizes.
        on_primary.hset(keys.worker_heartbeat("bench"), mapping={"engines": "synthetic", "voices": VOICE})
        on_primary.expire(keys.worker_heartbeat("bench"), 3600)
        on_primary.zadd(keys.WORKERS, {"bench": int(time.time() * 1000) + 3_600_000})
        gateways: dict[int, tuple[Proc, int]] = {
            n: start_gateway(primary.url, logs, VOXROOM_REDIS_WAIT_REPLICAS=str(n), **FAST) for n in (0, 1)}
        try:
            single: dict[int, list[float]] = {0: [], 1: []}
            burst: dict[int, list[float]] = {0: [], 1: []}
            for _ in range(2):  # warm-up rounds, not counted
                for _proc, port in gateways.values():
                    asyncio.run(one_at_a_time(port, 20))
            for _ in range(3):  # in turns, so that both settings see the same machine
                for n, (_proc, port) in gateways.items():
                    single[n] += asyncio.run(one_at_a_time(port, args.says // 3))
                    burst[n] += asyncio.run(bursts(port, args.burst, max(1, args.says // 30)))
        finally:
            for proc, _port in gateways.values():
                proc.stop()
            admin.close()
            on_primary.close()
    print(f"say -> accepted, ms (one primary, one replica, loopback; {len(single[0])} says one at a time, "
          f"{len(burst[0])} bursts of {args.burst} rooms)")
    print("| WAIT replicas | one at a time p50 | p99 | mean | burst of rooms p50 | p99 |")
    print("|---|---|---|---|---|---|")
    for n in (0, 1):
        s, b = single[n], burst[n]
        print(f"| {n} | {percentile(s, 50):.2f} | {percentile(s, 99):.2f} | {statistics.mean(s):.2f} "
              f"| {percentile(b, 50):.1f} | {percentile(b, 99):.1f} |")


if __name__ == "__main__":
    main()
