"""What a slow ``POST /v1/audio/speech`` reader costs Redis, and what it gets.

    .venv/bin/python bench/speech_slow_reader.py [--chars 4000] [--paces 0 24 12 6]

Starts its own redis-server, one synthetic worker (a hundredth of real time, 1 s resume window,
so that a reader falls behind it at once; tests/api/slow_reader.py) and one gateway. The same long
PCM response is read at each pace (seconds of audio read per second; 0: as fast as it comes).
Printed per pace: the body's length against the fast read's (seconds missing), whether it ended
with its terminating chunk, the wall time, and the private room's output stream at its largest
while it was read (entries, and ``MEMORY USAGE`` of the key), against what the whole response
would hold: the gateway trims what it sent, the workers never trim a private room.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from redis.asyncio import Redis  # noqa: E402

from tests.api.slow_reader import PCM_BYTES_PER_S, WORKER_ENV, long_input  # noqa: E402
from tests.support.processes import start_gateway, start_worker  # noqa: E402
from tests.support.raw_http import RawResponse, RawStream  # noqa: E402
from voxroom.store import keys  # noqa: E402
from voxroom.store.server import RedisServer  # noqa: E402


async def one(port: int, redis: Redis, chars: int, pace: float) -> tuple[RawResponse, float, int, int]:
    most_entries = most_bytes = 0

    async def watch(resp: RawResponse) -> None:
        nonlocal most_entries, most_bytes
        if len(resp.body) % (64 * 4096) < 4096:
            async for name in redis.scan_iter(match=keys.room_output(keys.PRIVATE_ROOM_PREFIX + "*")):
                most_entries = max(most_entries, int(await redis.xlen(name)))
                most_bytes = max(most_bytes, int(await redis.memory_usage(name) or 0))

    stream = RawStream(port, "/v1/audio/speech", {"input": long_input(chars), "voice": "en-joe",
                                                  "response_format": "pcm"})
    started = time.monotonic()
    try:
        await stream.start()
        resp = await stream.read_body(rate=pace * PCM_BYTES_PER_S if pace else None, on_piece=watch, timeout=600)
    finally:
        await stream.close()
    return resp, time.monotonic() - started, most_entries, most_bytes


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--chars", type=int, default=4000)
    parser.add_argument("--paces", type=float, nargs="+", default=[0, 24, 12, 6])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as logs, RedisServer() as server:
        worker = start_worker(server.url, Path(logs), engine="synthetic", contexts=2, **WORKER_ENV)
        gateway, port = start_gateway(server.url, Path(logs))
        redis = Redis.from_url(server.url)
        try:
            rows = [(pace, *await one(port, redis, args.chars, pace)) for pace in args.paces]
        finally:
            await redis.aclose()
            gateway.stop()
            worker.stop()
    whole = len(rows[0][1].body)
    entries = whole // 1920
    print(f"{args.chars} characters: {whole / PCM_BYTES_PER_S:.1f} s of audio, {entries} slices "
          f"(about {whole / 2**20:.1f} MiB of PCM)")
    print("| pace (x real time) | missing, s | terminated | wall, s | stream at most: entries | MiB |")
    print("|---|---|---|---|---|---|")
    for pace, resp, wall, most, most_bytes in rows:
        print(f"| {pace or 'fast':} | {(whole - len(resp.body)) / PCM_BYTES_PER_S:.1f} | {resp.complete} | "
              f"{wall:.1f} | {most} ({most / entries:.0%}) | {most_bytes / 2**20:.2f} |")


if __name__ == "__main__":
    asyncio.run(main())
