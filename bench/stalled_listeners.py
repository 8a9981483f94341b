"""Does a listener that stops reading stall its room? Gaps between slices at a healthy listener,
with and without stalled listeners beside it, in the same run.

    .venv/bin/python bench/stalled_listeners.py [--stalled 3] [--rounds 3]

Starts its own redis-server, one worker (offline voices) and one gateway. Each round: a healthy
listener (the websockets library) says two lines in a room where ``--stalled`` raw clients
completed the WebSocket handshake and then never read a byte (the first round has none: the
baseline). Printed per configuration: the gaps between consecutive audio frames at the healthy
listener (p50 / p99 / max, ms; slices are 40 ms of audio published 120 ms ahead, so gaps well under
40 ms are bursts and a stall shows as a gap of hundreds), and how many slices the gateway dropped
for the stalled clients. The test suite checks that the healthy listener gets every slice in order
(tests/reliability/test_load.py); how evenly is a time, measured here.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import itertools
import os
import socket
import statistics
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from tests.support.processes import start_gateway, start_worker  # noqa: E402
from tests.support.room_client import RoomClient  # noqa: E402
from voxroom.store.server import RedisServer  # noqa: E402

LINES = ("The village gathers at dawn. Somebody among you is not who they claim to be, and before the sun "
         "sets again you will have to decide, together, who that somebody is.",
         "And a second line right behind it.")


def raw_listener(port: int, room: str) -> socket.socket:
    """Completes the handshake, then never reads."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall((f"GET /rooms/{room}/ws HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                  f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    return sock


async def one_round(port: int, stalled: int) -> list[float]:
    room = f"stall-{uuid.uuid4().hex[:8]}"
    socks = [raw_listener(port, room) for _ in range(stalled)]
    try:
        async with RoomClient(port, room) as healthy:
            await healthy.say(LINES[0], voice="en-joe")
            await healthy.say(LINES[1], voice="en-espeak")
            await healthy.wait_ends(2, timeout=90)
            times = healthy.got.frame_times
            return [b - a for a, b in itertools.pairwise(times)]
    finally:
        for sock in socks:
            sock.close()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stalled", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="voxroom-stalled-"))
    with RedisServer() as redis:
        worker = start_worker(redis.url, logs)
        gateway, port = start_gateway(redis.url, logs)
        try:
            rows = []
            for stalled in (0, args.stalled):
                gaps: list[float] = []
                for _ in range(args.rounds):
                    gaps += await one_round(port, stalled)
                rows.append((stalled, gaps))
        finally:
            gateway.stop()
            worker.stop()
    print(f"\n{args.rounds} rounds of two lines each; gaps between audio frames at the healthy listener, ms\n")
    print("| stalled listeners | frames | p50 | p99 | max |")
    print("|---|---|---|---|---|")
    for stalled, gaps in rows:
        print(f"| {stalled} | {len(gaps) + args.rounds} | {statistics.median(gaps):.1f} | {pct(gaps, 99):.1f} | "
              f"{max(gaps):.1f} |")


if __name__ == "__main__":
    asyncio.run(main())
