"""Time to first audio for an audio-cache hit against a miss, over real processes.

    .venv/bin/python bench/cache.py [--lines 15]

Starts a redis-server, one worker (offline voices, two CPU contexts) and one gateway, exactly as
``voxroom serve`` would. For each voice, each of ``--lines`` distinct lines is said once (a miss:
the engine runs) and then again (a hit: the worker's LRU, or Redis for a second worker); time to
first audio is from sending ``say`` over the WebSocket to receiving the utterance's first audio
frame, one utterance at a time in a fresh room. The same for ``POST /v1/audio/speech`` (time to
the first body byte, and to the whole body). A second stack runs its worker with
``VOXROOM_CACHE_LRU_ENTRIES=0``, so that every hit comes from Redis.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import numpy as np
import websockets

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.processes import Proc, start_gateway, start_worker
from voxroom.store.server import RedisServer
from voxroom.wire.protocol import AudioFrame

WORDS = ["wolf", "seer", "village", "night", "moon", "hunter", "witch", "guard", "forest", "river", "fire", "bell"]


def lines(count: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [f"The {rng.choice(WORDS)} and the {rng.choice(WORDS)} meet at the {rng.choice(WORDS)} "
            f"{int(rng.integers(10, 99))} times tonight." for _ in range(count)]


async def ws_ttfa(port: int, text: str, voice: str) -> float:
    async with websockets.connect(f"ws://127.0.0.1:{port}/rooms/b-{uuid.uuid4().hex[:10]}/ws") as ws:
        await ws.recv()  # welcome
        t0 = time.perf_counter()
        await ws.send(json.dumps({"type": "say", "seq": 1, "text": text, "voice": voice}))
        first = None
        while True:
            message = await asyncio.wait_for(ws.recv(), 30)
            if isinstance(message, bytes) and first is None:
                AudioFrame.decode(message)
                first = (time.perf_counter() - t0) * 1000
            elif isinstance(message, str) and json.loads(message).get("type") in ("end", "error"):
                assert first is not None, message
                return first


async def http_ttfb(port: int, text: str, voice: str) -> tuple[float, float]:
    async with httpx.AsyncClient(timeout=30) as http:
        t0 = time.perf_counter()
        async with http.stream("POST", f"http://127.0.0.1:{port}/v1/audio/speech",
                               json={"input": text, "voice": voice, "response_format": "pcm"}) as resp:
            first = None
            async for _ in resp.aiter_raw():
                first = first or (time.perf_counter() - t0) * 1000
        assert resp.status_code == 200 and first is not None
        return first, (time.perf_counter() - t0) * 1000


def row(label: str, values: list[float]) -> str:
    return f"| {label} | {len(values)} | {np.percentile(values, 50):.1f} | {np.percentile(values, 95):.1f} |"


async def one_stack(args: argparse.Namespace, voices: list[str], label: str, **env: str) -> None:
    logs = Path(tempfile.mkdtemp(prefix="bench-cache-"))
    with RedisServer() as redis:
        worker: Proc = start_worker(redis.url, logs, engine="offline", contexts=2, **env)
        gateway, port = start_gateway(redis.url, logs)
        try:
            for voice in voices:
                texts = lines(args.lines, seed=len(voice) * 7 + len(label))
                await ws_ttfa(port, "Warm up the engine.", voice)
                miss = [await ws_ttfa(port, t, voice) for t in texts]
                hit = [await ws_ttfa(port, t, voice) for t in texts]
                print(row(f"{voice} WebSocket, miss", miss))
                print(row(f"{voice} WebSocket, hit ({label})", hit), flush=True)
                fresh = lines(args.lines, seed=len(voice) * 7 + len(label) + 1)
                http_miss = [await http_ttfb(port, t, voice) for t in fresh]
                http_hit = [await http_ttfb(port, t, voice) for t in fresh]
                print(row(f"{voice} HTTP first byte, miss", [a for a, _ in http_miss]))
                print(row(f"{voice} HTTP first byte, hit ({label})", [a for a, _ in http_hit]))
                print(row(f"{voice} HTTP whole body, miss", [b for _, b in http_miss]))
                print(row(f"{voice} HTTP whole body, hit ({label})", [b for _, b in http_hit]), flush=True)
        finally:
            gateway.stop()
            worker.stop()


async def run(args: argparse.Namespace) -> None:
    print("| path | n | p50 ms | p95 ms |")
    print("|---|---|---|---|")
    await one_stack(args, ["en-joe", "en-espeak"], "LRU")
    await one_stack(args, ["en-joe"], "Redis", VOXROOM_CACHE_LRU_ENTRIES="0")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=15)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
